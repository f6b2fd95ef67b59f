package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// Version is the stream protocol's version. A client and a server of different versions
// refuse each other at the hello, so bump it for any change a reader of the old version
// would misread: a new event kind, a new frame type, a field whose meaning changes.
//
// History:
//
//	1: hello, snapshot, events, dropped, status, error; the client sends snapshot, pause,
//	   resume, step.
//	2: blocked reasons travel by name ("watermark", not 5); the arena geometry's fields are
//	   snake_case; snapshots carry last_match; timeline marks are formatted when sent.
//	3: snapshots carry derived: the counts the dashboard and /metrics show, with the page
//	   states prepared, awaiting-kv and partly-received; prefix_changed carries the recycling
//	   sequences in eviction order and the counterfactual's counters; seq_evicted names the
//	   request and the recycle stamps; the config has evict_order and counterfactual.
//	4: the stale-kv-write hazard (totals count six hazard kinds); hazards carry offset,
//	   tokens and holder.
//	5: the binary encoding of events frames (binary.go), which a client asks for at the
//	   handshake; the hello says which encoding the events come in ("events").
//	6: the divergence event of a tap's shadow (kvtop tap); snapshots of a shadow carry its
//	   standing ("follow").
//	7: the page state unknown (a shadow's pages of unknown use): page counts have nine
//	   states; a shadow's standing lists those pages (unknown_page_ids), and a divergence
//	   the ones whose use became known again (explained).
const Version = 7

// The frame types. The server sends hello first, then snapshot, then any of the others;
// a client sends only the control types.
const (
	FrameHello    = "hello"
	FrameSnapshot = "snapshot"
	FrameEvents   = "events"
	FrameDropped  = "dropped"
	FrameStatus   = "status"
	FrameError    = "error"
)

// ErrViolation is returned for a frame or a message that does not follow the protocol.
var ErrViolation = errors.New("protocol: violation")

// Frame is one websocket message from the server. Type says which of the other fields is
// set. Snapshot and events frames carry Seq, which increases by exactly one from frame to
// frame on a connection: a client that sees a gap asks for a snapshot.
type Frame struct {
	Type     string           `json:"type"`
	Seq      uint64           `json:"seq,omitempty"`
	Hello    *Hello           `json:"hello,omitempty"`
	Snapshot *engine.Snapshot `json:"snapshot,omitempty"`
	Events   []engine.Event   `json:"-"` // encoded by EncodeFrame as "events"
	Dropped  *Dropped         `json:"dropped,omitempty"`
	Status   *feed.Status     `json:"status,omitempty"`
	Error    *ErrorBody       `json:"error,omitempty"`
}

// Hello is the first frame on a stream.
type Hello struct {
	Protocol int           `json:"protocol"`
	Server   string        `json:"server"` // "kvtop 0.1.0"
	Config   engine.Config `json:"config"`
	// Control says whether this client may pause, resume and step the engine.
	Control bool `json:"control"`
	// PingIntervalMs is how often the server pings; a client that hears nothing for a few
	// intervals can assume the connection is dead.
	PingIntervalMs int64 `json:"ping_interval_ms"`
	// MaxMessageBytes is the largest message the server reads from the client.
	MaxMessageBytes int64 `json:"max_message_bytes"`
	// Events is the encoding of the events frames that follow: "json" (or empty), or
	// "binary" (binary websocket messages, binary.go) for a client that asked for it at the
	// handshake.
	Events string `json:"events,omitempty"`
}

// Dropped tells a client it fell behind: Count events were thrown away since the last
// notice (Total since it connected), and a fresh snapshot follows.
type Dropped struct {
	Count uint64 `json:"count"`
	Total uint64 `json:"total"`
}

// ErrorBody is the body of every error: the "error" object of an HTTP error answer and of
// an error frame. Type is a stable snake_case name a program can match; Message says what
// was wrong, for a person.
type ErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
}

// ClientMessage is a client's message: {"type": "snapshot"}, {"type": "pause"},
// {"type": "resume"}, {"type": "step", "n": 3}. The control ones are refused with an error
// frame unless the server runs with control on.
type ClientMessage struct {
	Type string `json:"type"`
	N    int    `json:"n,omitempty"`
}

// EncodeFrame appends f's JSON to buf. Events are written as objects with their kind first
// ({"kind": "request_arrived", "step": 3, ...}), which DecodeEvent reads back.
func EncodeFrame(buf *bytes.Buffer, f *Frame) error {
	var enc Encoder
	return enc.Encode(buf, f)
}

// Encode appends f's JSON to buf, as EncodeFrame does, reusing the encoder's scratch space
// from one frame to the next (a stream connection keeps one).
func (e *Encoder) Encode(buf *bytes.Buffer, f *Frame) error {
	if f.Type != FrameEvents {
		b, err := json.Marshal(f)
		if err != nil {
			return fmt.Errorf("protocol: encode %s frame: %w", f.Type, err)
		}
		buf.Write(b)
		return nil
	}
	return e.frame(buf, f.Seq, f.Events)
}

// DecodeFrame parses a server frame, events included.
func DecodeFrame(b []byte) (*Frame, error) {
	if f, ok, err := decodeEventsFrame(b); ok {
		return f, err
	}
	var raw struct {
		Frame
		Events []json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%w: frame: %v", ErrViolation, err)
	}
	f := raw.Frame
	var missing bool
	switch f.Type {
	case FrameHello:
		missing = f.Hello == nil
	case FrameSnapshot:
		missing = f.Snapshot == nil
	case FrameEvents:
		f.Events = make([]engine.Event, 0, len(raw.Events))
		for i, r := range raw.Events {
			ev, err := DecodeEvent(r)
			if err != nil {
				return nil, fmt.Errorf("event %d of frame %d: %w", i, f.Seq, err)
			}
			f.Events = append(f.Events, ev)
		}
	case FrameDropped:
		missing = f.Dropped == nil
	case FrameStatus:
		missing = f.Status == nil
	case FrameError:
		missing = f.Error == nil
	default:
		return nil, fmt.Errorf("%w: unknown frame type %q", ErrViolation, f.Type)
	}
	if missing {
		return nil, fmt.Errorf("%w: %s frame without its %q field", ErrViolation, f.Type, f.Type)
	}
	return &f, nil
}

// decodeEventsFrame reads an events frame in the exact form the encoder writes it, finding
// each event's bounds by hand so that the frame is not parsed twice (once whole, once an
// event at a time): decoding is what bounds a client's throughput. It reports false for
// anything else, which DecodeFrame then parses in full.
func decodeEventsFrame(b []byte) (*Frame, bool, error) {
	const head, mid = `{"type":"events","seq":`, `,"events":[`
	rest, ok := bytes.CutPrefix(b, []byte(head))
	if !ok {
		return nil, false, nil
	}
	i := 0
	for i < len(rest) && i < 20 && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	seq, err := strconv.ParseUint(string(rest[:i]), 10, 64)
	if err != nil {
		return nil, false, nil
	}
	if rest, ok = bytes.CutPrefix(rest[i:], []byte(mid)); !ok {
		return nil, false, nil
	}
	f := &Frame{Type: FrameEvents, Seq: seq, Events: make([]engine.Event, 0, bytes.Count(rest, []byte(`{"kind":"`)))}
	for len(rest) > 0 && rest[0] != ']' {
		n := objectEnd(rest)
		if n < 0 {
			return nil, false, nil
		}
		ev, err := DecodeEvent(rest[:n])
		if err != nil {
			return nil, true, fmt.Errorf("event %d of frame %d: %w", len(f.Events), seq, err)
		}
		f.Events = append(f.Events, ev)
		rest = rest[n:]
		if len(rest) > 0 && rest[0] == ',' {
			rest = rest[1:]
		}
	}
	if string(rest) != "]}" {
		return nil, false, nil
	}
	return f, true, nil
}

// objectEnd returns the length of the JSON object at the start of b (strings and nesting
// respected), or -1. It does not validate; json.Unmarshal of the object does.
func objectEnd(b []byte) int {
	if len(b) == 0 || b[0] != '{' {
		return -1
	}
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// EncodeEvent returns an event's JSON: its fields, with "kind" first.
func EncodeEvent(ev engine.Event) ([]byte, error) {
	var enc Encoder
	var buf bytes.Buffer
	if err := enc.event(&buf, ev); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// DecodeEvent parses an event written by EncodeEvent (or any JSON object with a "kind" and
// the event's fields) into the engine's value type.
func DecodeEvent(b []byte) (engine.Event, error) {
	kind, ok := leadingKind(b)
	if !ok {
		var k struct {
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(b, &k); err != nil {
			return nil, fmt.Errorf("%w: event: %v", ErrViolation, err)
		}
		kind = k.Kind
	}
	ev, ok := engine.NewEvent(kind)
	if !ok {
		return nil, fmt.Errorf("%w: unknown event kind %q", ErrViolation, kind)
	}
	if err := json.Unmarshal(b, ev); err != nil {
		return nil, fmt.Errorf("%w: %s event: %v", ErrViolation, kind, err)
	}
	return engine.Deref(ev), nil
}

// leadingKind reads the kind of an event that starts {"kind":"…", as the encoder writes
// it, without parsing the rest twice.
func leadingKind(b []byte) (string, bool) {
	const prefix = `{"kind":"`
	if !bytes.HasPrefix(b, []byte(prefix)) {
		return "", false
	}
	rest := b[len(prefix):]
	i := bytes.IndexByte(rest, '"')
	if i <= 0 || bytes.IndexByte(rest[:i], '\\') >= 0 {
		return "", false
	}
	return string(rest[:i]), true
}

// Encoder writes frames with a reused scratch buffer: one allocation-light pass per event,
// the kind spliced in front of the event's own fields. The zero Encoder is ready to use; it
// is not safe for concurrent use.
type Encoder struct {
	scratch bytes.Buffer
	enc     *json.Encoder
}

func (e *Encoder) event(buf *bytes.Buffer, ev engine.Event) error {
	if e.enc == nil {
		e.enc = json.NewEncoder(&e.scratch)
		e.enc.SetEscapeHTML(false)
	}
	e.scratch.Reset()
	if err := e.enc.Encode(ev); err != nil {
		return fmt.Errorf("protocol: encode %s event: %w", engine.KindOf(ev), err)
	}
	body := bytes.TrimRight(e.scratch.Bytes(), "\n")
	if len(body) < 2 || body[0] != '{' {
		return fmt.Errorf("protocol: encode %s event: not a JSON object", engine.KindOf(ev))
	}
	buf.WriteString(`{"kind":"`)
	buf.WriteString(engine.KindOf(ev))
	buf.WriteByte('"')
	if len(body) > 2 { // not {}
		buf.WriteByte(',')
	}
	buf.Write(body[1:])
	return nil
}

func (e *Encoder) frame(buf *bytes.Buffer, seq uint64, evs []engine.Event) error {
	fmt.Fprintf(buf, `{"type":"events","seq":%d,"events":[`, seq)
	if err := e.events(buf, evs); err != nil {
		return err
	}
	buf.WriteString("]}")
	return nil
}

// events appends the events' JSON objects, separated by commas.
func (e *Encoder) events(buf *bytes.Buffer, evs []engine.Event) error {
	for i, ev := range evs {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := e.event(buf, ev); err != nil {
			return err
		}
	}
	return nil
}

// SharedSnapshot is a snapshot encoded once for every connection that sends it: a server
// with many clients encodes each snapshot once, and each connection wraps the same bytes
// in a frame with its own seq.
type SharedSnapshot struct {
	body []byte
}

// EncodeSnapshot encodes s for sharing.
func EncodeSnapshot(s *engine.Snapshot) (*SharedSnapshot, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode snapshot: %w", err)
	}
	return &SharedSnapshot{body: b}, nil
}

// Len returns the size of the encoded snapshot.
func (s *SharedSnapshot) Len() int { return len(s.body) }

// WriteFrame writes the snapshot frame with seq to w: byte for byte what Encode writes for
// &Frame{Type: FrameSnapshot, Seq: seq, Snapshot: s}.
func (s *SharedSnapshot) WriteFrame(w io.Writer, seq uint64) error {
	head := `{"type":"snapshot","snapshot":`
	if seq > 0 {
		head = `{"type":"snapshot","seq":` + strconv.FormatUint(seq, 10) + `,"snapshot":`
	}
	if _, err := io.WriteString(w, head); err != nil {
		return err
	}
	if _, err := w.Write(s.body); err != nil {
		return err
	}
	_, err := io.WriteString(w, "}")
	return err
}
