package protocol_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/sim"
	"github.com/kvtop/kvtop/wire/protocol"
)

// hexDump writes bytes as golden text: 32 bytes a line.
func hexDump(b []byte) []byte {
	var out bytes.Buffer
	for len(b) > 0 {
		n := min(32, len(b))
		out.WriteString(hex.EncodeToString(b[:n]))
		out.WriteByte('\n')
		b = b[n:]
	}
	return out.Bytes()
}

// Every event kind, every field set, round-trips through the binary encoding alone and in a
// frame, and matches its golden bytes.
func TestBinaryEventsRoundTrip(t *testing.T) {
	samples := sampleEvents()
	for i, ev := range samples {
		b, err := protocol.EncodeBinaryEvents(uint64(i), []engine.Event{ev})
		if err != nil {
			t.Fatalf("EncodeBinaryEvents(%s): %v", engine.KindOf(ev), err)
		}
		golden(t, filepath.Join("binary", engine.KindOf(ev)+".hex"), hexDump(b))
		f, err := protocol.DecodeBinaryEvents(b)
		if err != nil {
			t.Fatalf("DecodeBinaryEvents(%s): %v", engine.KindOf(ev), err)
		}
		if f.Type != protocol.FrameEvents || f.Seq != uint64(i) || len(f.Events) != 1 || !reflect.DeepEqual(f.Events[0], ev) {
			t.Errorf("the binary %s round-trips to %+v, want %#v", engine.KindOf(ev), f, ev)
		}
	}
	b, err := protocol.EncodeBinaryEvents(2, samples)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, filepath.Join("binary", "frame.hex"), hexDump(b))
	f, err := protocol.DecodeBinaryEvents(b)
	if err != nil || f.Seq != 2 || !reflect.DeepEqual(f.Events, samples) {
		t.Errorf("a binary frame of every kind does not round-trip: %v", err)
	}
	if js, bin := frameSize(t, samples, protocol.EncodingJSON), len(b); bin*3 > js {
		t.Errorf("the binary frame is %d bytes, the JSON one %d: want under a third", bin, js)
	}
}

func frameSize(t *testing.T, evs []engine.Event, enc protocol.Encoding) int {
	var buf bytes.Buffer
	if err := protocol.WriteEvents(&buf, 1, enc, []*protocol.SharedEvents{protocol.ShareEvents(evs)}); err != nil {
		t.Fatal(err)
	}
	return buf.Len()
}

// randomValue fills v with random contents: lists nil, empty or not, pointers nil or not,
// strings of any bytes, integers at their extremes, enumerations at every named value.
func randomValue(rng *rand.Rand, v reflect.Value) {
	if v.Type().Implements(reflect.TypeFor[interface{ MarshalText() ([]byte, error) }]()) && v.Kind() == reflect.Uint8 {
		for {
			x := reflect.New(v.Type()).Elem()
			x.SetUint(uint64(rng.IntN(12)))
			b, _ := x.Interface().(interface{ MarshalText() ([]byte, error) }).MarshalText()
			back := reflect.New(v.Type())
			if back.Interface().(interface{ UnmarshalText([]byte) error }).UnmarshalText(b) == nil && back.Elem().Uint() == x.Uint() {
				v.Set(x)
				return
			}
		}
	}
	pick := func(vals ...int64) int64 {
		if rng.IntN(3) == 0 {
			return vals[rng.IntN(len(vals))]
		}
		return rng.Int64N(1000) - 100
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(rng.IntN(2) == 0)
	case reflect.Int, reflect.Int64:
		v.SetInt(pick(math.MinInt64, math.MaxInt64, -1, 0, 63, 64, -64, -65))
	case reflect.Int32:
		v.SetInt(pick(math.MinInt32, math.MaxInt32, -1, 0))
	case reflect.Uint64:
		v.SetUint(uint64(pick(-1, 0, 127, 128)))
	case reflect.Uint32:
		v.SetUint(uint64(uint32(pick(-1, 0, 127, 128))))
	case reflect.Uint8:
		v.SetUint(uint64(rng.IntN(256)))
	case reflect.String:
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		v.SetString(string(b))
	case reflect.Struct:
		for i := range v.NumField() {
			randomValue(rng, v.Field(i))
		}
	case reflect.Pointer:
		if rng.IntN(2) == 0 {
			v.Set(reflect.New(v.Type().Elem()))
			randomValue(rng, v.Elem())
		}
	case reflect.Slice:
		switch rng.IntN(4) {
		case 0: // nil
		case 1:
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
		default:
			v.Set(reflect.MakeSlice(v.Type(), 1+rng.IntN(4), 4))
			for i := range v.Len() {
				randomValue(rng, v.Index(i))
			}
		}
	case reflect.Array:
		for i := range v.Len() {
			randomValue(rng, v.Index(i))
		}
	default:
		panic(fmt.Sprintf("randomValue: %s", v.Kind()))
	}
}

// Random events of every kind, lists nil and empty, pointers set and not, strings that are
// not UTF-8 and integers at their extremes, come back from the binary encoding exactly.
func TestBinaryRoundTripsEveryValue(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var evs []engine.Event
	for range 200 {
		for _, k := range engine.EventKinds() {
			p, _ := engine.NewEvent(k)
			randomValue(rng, reflect.ValueOf(p).Elem())
			evs = append(evs, engine.Deref(p))
		}
	}
	b, err := protocol.EncodeBinaryEvents(math.MaxUint64, evs)
	if err != nil {
		t.Fatal(err)
	}
	f, err := protocol.DecodeBinaryEvents(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		if !reflect.DeepEqual(f.Events[i], evs[i]) {
			t.Fatalf("event %d: %#v comes back as %#v", i, evs[i], f.Events[i])
		}
	}
}

// A real engine's events are the same through either encoding.
func TestBinaryAgreesWithJSON(t *testing.T) {
	evs := engineLog(t)
	var js bytes.Buffer
	if err := protocol.EncodeFrame(&js, &protocol.Frame{Type: protocol.FrameEvents, Seq: 9, Events: evs}); err != nil {
		t.Fatal(err)
	}
	fromJSON, err := protocol.DecodeFrame(js.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	bin, err := protocol.EncodeBinaryEvents(9, evs)
	if err != nil {
		t.Fatal(err)
	}
	fromBinary, err := protocol.DecodeBinaryEvents(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromBinary.Events, evs) || !reflect.DeepEqual(fromJSON.Events, evs) {
		t.Errorf("%d events of an engine do not come back the same from both encodings", len(evs))
	}
	t.Logf("%d events: %d bytes of JSON, %d of binary", len(evs), js.Len(), len(bin))
}

// A binary frame that is cut short, says too much, or holds a value its type cannot have
// is a protocol violation, never a panic or a partial frame.
func TestBinaryRefusesBadFrames(t *testing.T) {
	good, err := protocol.EncodeBinaryEvents(5, sampleEvents())
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(good) - 1 {
		if _, err := protocol.DecodeBinaryEvents(good[:i]); !errors.Is(err, protocol.ErrViolation) {
			t.Fatalf("the frame cut at byte %d of %d: %v, want a violation", i, len(good), err)
		}
	}
	seqPopped := func(fields ...byte) []byte { return append([]byte{1, 5, 1, 7}, fields...) }
	for name, b := range map[string][]byte{
		"trailing byte":     append(bytes.Clone(good), 0),
		"not events":        {2, 5, 0},
		"unknown kind":      {1, 5, 1, 99},
		"kind zero":         {1, 5, 1, 0},
		"more events":       {1, 5, 200, 7, 0, 0, 0, 0},
		"overlong integer":  seqPopped(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"bool of 2":         {1, 5, 1, 14, 0, 0, 0, 0, 0, 2},
		"action 200":        append([]byte{1, 5, 1, 22, 0, 0}, 0xc8, 0x01),
		"huge list":         {1, 5, 1, 16, 0, 0, 0xff, 0xff, 0x03},
		"huge string":       {1, 5, 1, 1, 0, 0, 0xff, 0x0f},
		"node id over 2^32": {1, 5, 1, 20, 0, 0, 1, 2, 0x80, 0x80, 0x80, 0x80, 0x10},
	} {
		if f, err := protocol.DecodeBinaryEvents(b); !errors.Is(err, protocol.ErrViolation) {
			t.Errorf("%s: DecodeBinaryEvents(% x) = %+v, %v; want a violation", name, b, f, err)
		}
	}
}

// WriteEvents of shared runs writes exactly the frame of all their events, in either
// encoding, however the events are cut into runs.
func TestWriteEventsIsTheFrame(t *testing.T) {
	evs := sampleEvents()
	for _, cuts := range [][]int{{}, {0}, {3}, {1, 1, 5}, {10, 21}} {
		var runs []*protocol.SharedEvents
		from := 0
		for _, c := range append(cuts, len(evs)) {
			runs = append(runs, protocol.ShareEvents(evs[from:c]))
			from = c
		}
		var js, bin bytes.Buffer
		if err := protocol.WriteEvents(&js, 7, protocol.EncodingJSON, runs); err != nil {
			t.Fatal(err)
		}
		if err := protocol.WriteEvents(&bin, 7, protocol.EncodingBinary, runs); err != nil {
			t.Fatal(err)
		}
		var want bytes.Buffer
		if err := protocol.EncodeFrame(&want, &protocol.Frame{Type: protocol.FrameEvents, Seq: 7, Events: evs}); err != nil {
			t.Fatal(err)
		}
		wantBin, _ := protocol.EncodeBinaryEvents(7, evs)
		if !bytes.Equal(js.Bytes(), want.Bytes()) {
			t.Errorf("cut at %v: the JSON frame differs from EncodeFrame's:\n got %.300s\nwant %.300s", cuts, js.Bytes(), want.Bytes())
		}
		if !bytes.Equal(bin.Bytes(), wantBin) {
			t.Errorf("cut at %v: the binary frame differs from EncodeBinaryEvents'", cuts)
		}
	}
}

// FuzzDecodeBinaryEvents feeds binary frames to the client's decoder: it must not panic,
// and what it decodes comes back the same from another round trip.
func FuzzDecodeBinaryEvents(f *testing.F) {
	good, _ := protocol.EncodeBinaryEvents(5, sampleEvents())
	f.Add(good)
	for _, ev := range sampleEvents() {
		b, _ := protocol.EncodeBinaryEvents(1, []engine.Event{ev})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := protocol.DecodeBinaryEvents(b)
		if err != nil {
			if !errors.Is(err, protocol.ErrViolation) {
				t.Fatalf("DecodeBinaryEvents: %v, not a violation", err)
			}
			return
		}
		again, err := protocol.EncodeBinaryEvents(fr.Seq, fr.Events)
		if err != nil {
			t.Fatal(err)
		}
		back, err := protocol.DecodeBinaryEvents(again)
		if err != nil || !reflect.DeepEqual(back, fr) {
			t.Fatalf("frame %+v round-trips to %+v (%v)", fr, back, err)
		}
		if strings.Contains(fmt.Sprint(fr.Events), "%!") {
			t.Fatalf("an event decoded from % x does not describe itself: %v", b, fr.Events)
		}
	})
}

// engineLog returns the events of a few of the simulator's scenarios, a few hundred steps
// each: every kind an engine emits in practice, hazards included.
func engineLog(t testing.TB) []engine.Event {
	t.Helper()
	var evs []engine.Event
	for _, name := range []string{"chat", "leak", "fork-race", "preempt"} {
		sc, err := sim.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := engine.DefaultConfig()
		sc.Configure(&cfg)
		e, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		w, err := sc.New(sim.Options{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		l := sim.Lockstep{E: e, D: sim.NewDriver(w, sc.Driver), OnReady: func(rd engine.Ready) { evs = append(evs, rd.Events...) }}
		l.Run(400)
	}
	return evs
}
