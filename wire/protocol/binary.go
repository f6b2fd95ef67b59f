package protocol

import (
	"encoding"
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/kvtop/kvtop/engine"
)

// The binary encoding of events frames, which a client may ask for instead of JSON (wire
// negotiates it at the handshake and says so in the hello). JSON stays the protocol's
// default and its documented form; the binary one carries the same events, value for value,
// in about a fifth of the bytes and a tenth of the decoding time.
//
// An events frame is one websocket binary message:
//
//	0x01                      the frame's tag: events
//	uvarint seq               as in JSON
//	uvarint count             the events that follow
//	count × event             each: uvarint kind code, then its fields
//
// A kind's code is its place in engine.EventKinds, from 1. An event's fields follow in
// their declaration order, nested structs (the Stamp first) likewise: bool one byte (0 or
// 1), signed integers zigzag varints, unsigned ones uvarints, enumerations (prefix.Kind,
// engine.Action, …) uvarints of their value, strings a uvarint length and the bytes, lists
// a uvarint of length+1 (0: none) and the elements, a pointer a bool and, if set, the value.
// binary_gen.go is the code of it, generated from the event types (binary_gen_test.go).

// binFrameEvents tags a binary events frame.
const binFrameEvents = 0x01

// binWriter appends the binary encoding to b.
type binWriter struct{ b []byte }

func (w *binWriter) uint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *binWriter) int(v int64)   { w.b = binary.AppendVarint(w.b, v) }

func (w *binWriter) bool(v bool) bool {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
	return v
}

func (w *binWriter) string(s string) {
	w.uint(uint64(len(s)))
	w.b = append(w.b, s...)
}

// len writes a list's length, none for a nil list, and reports whether there is one.
func (w *binWriter) len(n int, isNil bool) bool {
	if isNil {
		w.uint(0)
		return false
	}
	w.uint(uint64(n) + 1)
	return true
}

// binReader reads the binary encoding. The first problem fails it for good: every later
// read returns a zero value, and err says what was wrong.
type binReader struct {
	b   []byte
	i   int
	err error
	// intern, when set, gives the same string for the same bytes: a client's frames name
	// the same requests over and over.
	intern map[string]string
}

func (r *binReader) failf(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: binary events frame at byte %d: %s", ErrViolation, r.i, fmt.Sprintf(format, args...))
	}
	r.i = len(r.b)
}

func (r *binReader) uint() uint64 {
	if r.i < len(r.b) && r.b[r.i] < 0x80 { // one byte: most values
		v := uint64(r.b[r.i])
		r.i++
		return v
	}
	v, n := binary.Uvarint(r.b[r.i:])
	if n <= 0 {
		r.failf("a truncated or overlong integer")
		return 0
	}
	r.i += n
	return v
}

func (r *binReader) int() int64 {
	u := r.uint()
	return int64(u>>1) ^ -int64(u&1)
}

func (r *binReader) int32() int32 {
	v := r.int()
	if v < math.MinInt32 || v > math.MaxInt32 {
		r.failf("%d is outside int32", v)
		return 0
	}
	return int32(v)
}

func (r *binReader) uint32() uint32 {
	v := r.uint()
	if v > math.MaxUint32 {
		r.failf("%d is outside uint32", v)
		return 0
	}
	return uint32(v)
}

func (r *binReader) uint8() uint8 {
	v := r.uint()
	if v > math.MaxUint8 {
		r.failf("%d is outside uint8", v)
		return 0
	}
	return uint8(v)
}

// enum reads a value of an enumeration whose named values valid lists.
func (r *binReader) enum(valid *[256]bool) uint8 {
	v := r.uint8()
	if !valid[v] {
		r.failf("%d is not a value with a name", v)
		return 0
	}
	return v
}

func (r *binReader) bool() bool {
	switch v := r.uint(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		r.failf("%d is not a bool", v)
		return false
	}
}

func (r *binReader) string() string {
	n := r.uint()
	if n > uint64(len(r.b)-r.i) {
		r.failf("a string of %d bytes, %d left", n, len(r.b)-r.i)
		return ""
	}
	b := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	if r.intern != nil && len(b) <= maxInterned {
		if s, ok := r.intern[string(b)]; ok {
			return s
		}
		if len(r.intern) >= maxInternTable {
			clear(r.intern)
		}
		s := string(b)
		r.intern[s] = s
		return s
	}
	return string(b)
}

// What a client's reader interns: strings as short as request ids, at most this many.
const (
	maxInterned    = 64
	maxInternTable = 1 << 16
)

// len reads a list's length: false for none. A list cannot have more elements than bytes
// left, since every element takes one at least.
func (r *binReader) len() (int, bool) {
	n := r.uint()
	if n == 0 {
		return 0, false
	}
	if n-1 > uint64(len(r.b)-r.i) {
		r.failf("a list of %d, %d bytes left", n-1, len(r.b)-r.i)
		return 0, false
	}
	return int(n - 1), true
}

// enumValues returns which values of an enumeration have a name: those whose text form
// reads back as the value, which is what JSON can carry.
func enumValues[T interface {
	~uint8
	encoding.TextMarshaler
}, P interface {
	*T
	encoding.TextUnmarshaler
}]() [256]bool {
	var valid [256]bool
	for v := range 256 {
		b, err := T(v).MarshalText()
		if err != nil || !utf8.Valid(b) {
			continue
		}
		var back T
		if P(&back).UnmarshalText(b) == nil && back == T(v) {
			valid[v] = true
		}
	}
	return valid
}

// appendBinaryEvents appends the events' binary encoding (no frame head) to dst.
func appendBinaryEvents(dst []byte, evs []engine.Event) ([]byte, error) {
	w := binWriter{b: dst}
	for _, ev := range evs {
		if !w.event(ev) {
			return dst, fmt.Errorf("protocol: binary encoding of %T: not an event kind", ev)
		}
	}
	return w.b, nil
}

// appendBinaryHead appends the head of a binary events frame of n events.
func appendBinaryHead(dst []byte, seq uint64, n int) []byte {
	dst = append(dst, binFrameEvents)
	dst = binary.AppendUvarint(dst, seq)
	return binary.AppendUvarint(dst, uint64(n))
}

// EncodeBinaryEvents returns the binary events frame of evs with seq.
func EncodeBinaryEvents(seq uint64, evs []engine.Event) ([]byte, error) {
	return appendBinaryEvents(appendBinaryHead(nil, seq, len(evs)), evs)
}

// BinaryDecoder decodes binary events frames. It keeps the request ids it has seen, so
// that the events of later frames share their strings; it is not safe for concurrent use.
// The zero BinaryDecoder is ready to use.
type BinaryDecoder struct {
	intern map[string]string
}

// DecodeBinaryEvents decodes a binary events frame into an events frame, as DecodeFrame
// does a JSON one.
func DecodeBinaryEvents(b []byte) (*Frame, error) {
	var d BinaryDecoder
	return d.Decode(b)
}

// Decode decodes a binary events frame.
func (d *BinaryDecoder) Decode(b []byte) (*Frame, error) {
	if d.intern == nil {
		d.intern = make(map[string]string)
	}
	r := binReader{b: b, intern: d.intern}
	if len(b) == 0 || b[0] != binFrameEvents {
		return nil, fmt.Errorf("%w: a binary frame that is not an events frame", ErrViolation)
	}
	r.i = 1
	seq := r.uint()
	n, ok := r.len1()
	f := &Frame{Type: FrameEvents, Seq: seq}
	if ok {
		f.Events = make([]engine.Event, 0, n)
	}
	for range n {
		ev := r.event()
		if r.err != nil {
			return nil, fmt.Errorf("event %d of frame %d: %w", len(f.Events), seq, r.err)
		}
		f.Events = append(f.Events, ev)
	}
	if r.err != nil {
		return nil, r.err
	}
	if r.i != len(b) {
		return nil, fmt.Errorf("%w: binary events frame %d: %d bytes after its %d events", ErrViolation, seq, len(b)-r.i, n)
	}
	return f, nil
}

// len1 reads a count of things that take a byte each at least.
func (r *binReader) len1() (int, bool) {
	n := r.uint()
	if n > uint64(len(r.b)-r.i) {
		r.failf("%d events, %d bytes left", n, len(r.b)-r.i)
		return 0, false
	}
	return int(n), r.err == nil
}
