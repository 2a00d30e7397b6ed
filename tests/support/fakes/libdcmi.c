/* A stand-in for the driver's libdcmi.so, with the two calls the agent's A3 pairing read makes. What it
 * answers comes from the environment the agent hands its child:
 *   FAKE_DCMI_INIT      dcmi_init's return code (default 0)
 *   FAKE_DCMI_WAIT      a FIFO dcmi_init reads to its end first: it hangs until the test writes and closes it
 *   FAKE_DCMI_BROTHERS  "CARD:BROTHER,..." (a card not named gets -1), or "ret:N" to fail every call with N
 * Each call is appended to FAKE_DCMI_LOG when it is set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void note(const char *what, int card) {
    const char *path = getenv("FAKE_DCMI_LOG");
    FILE *log = path ? fopen(path, "a") : NULL;
    if (log) {
        fprintf(log, "%s %d\n", what, card);
        fclose(log);
    }
}

int dcmi_init(void) {
    const char *code = getenv("FAKE_DCMI_INIT");
    const char *wait = getenv("FAKE_DCMI_WAIT");
    note("dcmi_init", -1);
    if (wait != NULL) {
        FILE *fifo = fopen(wait, "r");
        while (fifo != NULL && fgetc(fifo) != EOF) {
        }
        if (fifo != NULL) {
            fclose(fifo);
        }
    }
    return code ? atoi(code) : 0;
}

int dcmi_get_netdev_brother_device(int card_id, int device_id, int *brother_card_id) {
    const char *spec = getenv("FAKE_DCMI_BROTHERS");
    int card, brother, used;
    (void)device_id;
    note("dcmi_get_netdev_brother_device", card_id);
    *brother_card_id = -1;
    if (spec == NULL) {
        return 0;
    }
    if (strncmp(spec, "ret:", 4) == 0) {
        return atoi(spec + 4);
    }
    while (sscanf(spec, "%d:%d%n", &card, &brother, &used) == 2) {
        if (card == card_id) {
            *brother_card_id = brother;
        }
        spec += used;
        if (*spec != ',') {
            break;
        }
        spec++;
    }
    return 0;
}
