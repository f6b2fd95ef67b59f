package protocol

import (
	"bytes"
	"io"
	"strconv"
	"sync"

	"github.com/kvtop/kvtop/engine"
)

// Encoding is how a stream's events frames are written: JSON (the default, and the
// protocol's documented form) or binary (binary.go), which a client asks for.
type Encoding uint8

// The encodings of events frames.
const (
	EncodingJSON Encoding = iota
	EncodingBinary
)

func (e Encoding) String() string {
	if e == EncodingBinary {
		return "binary"
	}
	return "json"
}

// SharedEvents is a run of events encoded once for every connection that sends it, in each
// encoding one asks for (the first to ask encodes it): a server with many clients encodes
// each event once an encoding, and each connection writes the same bytes in frames of its
// own seq (WriteEvents). It is safe for concurrent use.
type SharedEvents struct {
	events []engine.Event
	enc    [2]struct {
		once sync.Once
		body []byte
		err  error
	}
}

// ShareEvents returns evs for sharing. evs must not change afterwards.
func ShareEvents(evs []engine.Event) *SharedEvents { return &SharedEvents{events: evs} }

// Events returns the events.
func (s *SharedEvents) Events() []engine.Event { return s.events }

// Len returns the number of events.
func (s *SharedEvents) Len() int { return len(s.events) }

// body returns the events' encoding without a frame's head or tail: in JSON the objects
// separated by commas, in binary the events one after the other.
func (s *SharedEvents) body(enc Encoding) ([]byte, error) {
	e := &s.enc[enc]
	e.once.Do(func() {
		if enc == EncodingBinary {
			e.body, e.err = appendBinaryEvents(make([]byte, 0, 32*len(s.events)), s.events)
			return
		}
		var buf bytes.Buffer
		buf.Grow(200 * len(s.events))
		var w Encoder
		e.err = w.events(&buf, s.events)
		e.body = buf.Bytes()
	})
	return e.body, e.err
}

// Size returns the bytes of the events in an encoding (encoding them if no one has).
func (s *SharedEvents) Size(enc Encoding) int {
	b, _ := s.body(enc)
	return len(b)
}

// WriteEvents writes one events frame with seq holding the events of runs, in order, in an
// encoding: byte for byte what Encode writes (JSON) or EncodeBinaryEvents returns (binary)
// for a frame of all their events.
func WriteEvents(w io.Writer, seq uint64, enc Encoding, runs []*SharedEvents) error {
	n := 0
	for _, r := range runs {
		n += r.Len()
	}
	var head []byte
	if enc == EncodingBinary {
		head = appendBinaryHead(nil, seq, n)
	} else {
		head = append(strconv.AppendUint([]byte(`{"type":"events","seq":`), seq, 10), `,"events":[`...)
	}
	if _, err := w.Write(head); err != nil {
		return err
	}
	first := true
	for _, r := range runs {
		b, err := r.body(enc)
		if err != nil {
			return err
		}
		if len(b) == 0 {
			continue
		}
		if !first && enc == EncodingJSON {
			if _, err := io.WriteString(w, ","); err != nil {
				return err
			}
		}
		first = false
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	if enc == EncodingJSON {
		_, err := io.WriteString(w, "]}")
		return err
	}
	return nil
}
