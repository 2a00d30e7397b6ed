/* The pod sandbox's first process: it keeps the pod's namespaces alive until the runtime stops it, and reaps
 * the orphans a shared PID namespace hands to it. Built static (gcc -Os -static) into the pause image. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void reap(int signal_number) {
    (void)signal_number;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = leave};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (sigaction(SIGINT, &on_stop, 0) < 0 || sigaction(SIGTERM, &on_stop, 0) < 0 ||
        sigaction(SIGCHLD, &on_child, 0) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
