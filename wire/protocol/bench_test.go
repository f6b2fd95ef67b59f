package protocol_test

import (
	"bytes"
	"testing"

	"github.com/kvtop/kvtop/wire/protocol"
)

// BenchmarkEvents is the encoding and the decoding of one frame of a real engine's events
// (engineLog: a few scenarios' 4,000 events), in each encoding; ns/event is the figure.
func BenchmarkEvents(b *testing.B) {
	evs := engineLog(b)
	for _, enc := range []protocol.Encoding{protocol.EncodingJSON, protocol.EncodingBinary} {
		var frame bytes.Buffer
		if err := protocol.WriteEvents(&frame, 1, enc, []*protocol.SharedEvents{protocol.ShareEvents(evs)}); err != nil {
			b.Fatal(err)
		}
		b.Run("encode/"+enc.String(), func(b *testing.B) {
			var buf bytes.Buffer
			b.SetBytes(int64(frame.Len()))
			b.ReportAllocs()
			for b.Loop() {
				buf.Reset()
				if err := protocol.WriteEvents(&buf, 1, enc, []*protocol.SharedEvents{protocol.ShareEvents(evs)}); err != nil {
					b.Fatal(err)
				}
			}
			perEvent(b, len(evs))
		})
		b.Run("decode/"+enc.String(), func(b *testing.B) {
			var d protocol.BinaryDecoder
			b.SetBytes(int64(frame.Len()))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				var f *protocol.Frame
				if enc == protocol.EncodingBinary {
					f, err = d.Decode(frame.Bytes())
				} else {
					f, err = protocol.DecodeFrame(frame.Bytes())
				}
				if err != nil || len(f.Events) != len(evs) {
					b.Fatal(err)
				}
			}
			perEvent(b, len(evs))
		})
	}
}

func perEvent(b *testing.B, n int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}
