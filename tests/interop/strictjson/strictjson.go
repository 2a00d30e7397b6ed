// Package strictjson decodes one JSON value as the decoders here read every document: a field the Go type
// does not have, or anything after the value, is an error.
package strictjson

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Decode fills into from data, refusing unknown fields and trailing data.
func Decode(data string, into interface{}) error {
	decoder := json.NewDecoder(strings.NewReader(data))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(into); err != nil {
		return err
	}
	if decoder.More() {
		return fmt.Errorf("data after the JSON value")
	}
	return nil
}
