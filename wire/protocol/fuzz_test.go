package protocol_test

import (
	"reflect"
	"testing"

	"github.com/kvtop/kvtop/wire/protocol"
)

// FuzzDecodeFrame feeds frames to the client's decoder: it must not panic, and every event
// it decodes survives a round trip.
func FuzzDecodeFrame(f *testing.F) {
	f.Add([]byte(`{"type":"events","seq":2,"events":[{"kind":"seq_popped","step":1,"at":2,"seq":4,"n":3}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := protocol.DecodeFrame(b)
		if err != nil {
			return
		}
		for _, ev := range fr.Events {
			enc, err := protocol.EncodeEvent(ev)
			if err != nil {
				t.Fatalf("EncodeEvent(%#v): %v", ev, err)
			}
			back, err := protocol.DecodeEvent(enc)
			if err != nil || !reflect.DeepEqual(back, ev) {
				t.Fatalf("event %#v round-trips to %#v (%v)", ev, back, err)
			}
		}
	})
}
