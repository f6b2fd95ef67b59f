package record

import (
	"bytes"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// lockedBuffer is a file the test can read while the recorder writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) Close() error { return nil }
func (l *lockedBuffer) Len() int     { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Len() }

// What is recorded reaches the file within FlushEvery, however little it is: a recorder
// killed without warning loses at most that much.
func TestRecorderFlushesWithinFlushEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var f lockedBuffer
		rec := NewRecorder(&f)
		s := engine.Snapshot{}
		if err := rec.Write(feed.Update{Snapshot: &s}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(FlushEvery)
		synctest.Wait()
		if f.Len() == 0 {
			t.Fatalf("nothing in the file %v after a write", FlushEvery)
		}
		n := f.Len()
		rec.Write(feed.Update{Events: []engine.Event{engine.SeqPopped{Seq: 1, N: 1}}})
		time.Sleep(FlushEvery)
		synctest.Wait()
		if f.Len() == n {
			t.Errorf("a second write did not reach the file within %v", FlushEvery)
		}
		if err := rec.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// A recording cut anywhere, as kill -9 leaves it (65,536 bytes ending mid-line, say),
// loads with everything before the cut line, and says the last line was cut short.
func TestTruncatedRecordingKeepsWhatCameBefore(t *testing.T) {
	data, snaps := live(t, 200)
	full, err := Load(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	firstLine := bytes.IndexByte(data, '\n')
	secondLine := firstLine + 1 + bytes.IndexByte(data[firstLine+1:], '\n')
	for _, cut := range []int{secondLine + 10, len(data) / 3, len(data) / 2, len(data) - 2} {
		in := data[:cut]
		if in[len(in)-1] == '\n' {
			in = in[:len(in)-1]
		}
		rec, err := Load(bytes.NewReader(in))
		if err != nil {
			t.Errorf("Load of the first %d of %d bytes: %v, want what came before the cut", cut, len(data), err)
			continue
		}
		if !strings.Contains(rec.Truncated, "cut short") {
			t.Errorf("Load of %d bytes: Truncated = %q, want it to say the last line was cut short", cut, rec.Truncated)
		}
		lines := bytes.Count(in, []byte{'\n'})
		if !strings.Contains(rec.Truncated, "line "+strconv.Itoa(lines+1)+" ") {
			t.Errorf("Load of %d bytes: Truncated = %q, want it to name line %d", cut, rec.Truncated, lines+1)
		}
		if rec.n > full.n {
			t.Fatalf("a cut recording has more items than the whole")
		}
		_, last := rec.Steps()
		v, _, err := rec.StateAt(last)
		if err != nil {
			t.Fatalf("StateAt(%d) of a cut recording: %v", last, err)
		}
		// Up to the last whole step before the cut, the state is the engine's.
		if last > 0 {
			if v, _, _ = rec.StateAt(last - 1); !reflect.DeepEqual(v.Snapshot(), snaps[last-1]) {
				t.Errorf("a recording cut at %d bytes: the state at step %d differs from the engine's", cut, last-1)
			}
		}
	}
	// A complete last line without its newline is a whole frame, not a cut one.
	rec, err := Load(bytes.NewReader(bytes.TrimRight(data, "\n")))
	if err != nil || rec.Truncated != "" || rec.n != full.n {
		t.Errorf("Load without the final newline: %v, Truncated %q, %d items (want %d)", err, rec.Truncated, rec.n, full.n)
	}
}

// countingReader counts what is read from it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// zeros is /dev/zero.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// braces is an endless line that starts like a recording.
type braces struct{ first bool }

func (b *braces) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	if !b.first && len(p) > 0 {
		p[0], b.first = '{', true
	}
	return len(p), nil
}

// What Load reads of a file that is not a recording is bounded: it refuses /dev/zero from
// its first bytes, and a line that never ends after lineLimit bytes.
func TestLoadBoundsWhatItReads(t *testing.T) {
	z := &countingReader{r: zeros{}}
	if _, err := Load(z); err == nil || !strings.Contains(err.Error(), "not a kvtop recording") {
		t.Errorf("Load(/dev/zero) = %v, want it refused as not a recording", err)
	}
	if z.n > 1<<20 {
		t.Errorf("Load(/dev/zero) read %d bytes before refusing it", z.n)
	}
	defer func(l int) { lineLimit = l }(lineLimit)
	lineLimit = 4 << 20
	b := &countingReader{r: &braces{}}
	if _, err := Load(b); err == nil || !strings.Contains(err.Error(), "without a newline") {
		t.Errorf("Load(an endless line) = %v, want it refused", err)
	}
	if b.n > int64(lineLimit)+1<<20 {
		t.Errorf("Load(an endless line) read %d bytes with a limit of %d", b.n, lineLimit)
	}
}

// A recording that spans a server restart has two epochs, each with its own steps (the
// second starts again from 0), and seeks within the epoch being played.
func TestRecordingAcrossARestartHasEpochs(t *testing.T) {
	var buf bytes.Buffer
	rec := NewRecorder(nopCloser{&buf})
	first := liveInto(t, rec, 0, 3, 160)
	second := liveInto(t, rec, 1, 5, 300) // the client reconnected to a restarted server
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(name string, data []byte) {
		t.Helper()
		r, err := Load(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		es := r.Epochs()
		if len(es) != 2 || es[0] != (Epoch{0, 161}) || es[1] != (Epoch{0, 301}) {
			t.Fatalf("%s: Epochs() = %v, want [{0 161} {0 301}]", name, es)
		}
		for _, tc := range []struct {
			epoch int
			step  uint64
			want  engine.Snapshot
		}{{0, 55, first[55]}, {1, 55, second[55]}, {1, 250, second[250]}, {0, 160, first[160]}} {
			v, _, err := r.StateIn(tc.epoch, tc.step)
			if err != nil {
				t.Fatalf("%s: StateIn(%d, %d): %v", name, tc.epoch, tc.step, err)
			}
			if !reflect.DeepEqual(v.Snapshot(), tc.want) {
				t.Errorf("%s: StateIn(%d, %d) differs from that run's engine at that step", name, tc.epoch, tc.step)
			}
		}
		if e, ok := r.Find(55, 1); !ok || e != 1 {
			t.Errorf("%s: Find(55) while playing epoch 1 = %d, %v; want epoch 1", name, e, ok)
		}
		if e, ok := r.Find(250, 0); !ok || e != 1 {
			t.Errorf("%s: Find(250) while playing epoch 0 = %d, %v; want epoch 1, the only one with it", name, e, ok)
		}
		if _, ok := r.Find(1000, 0); ok {
			t.Errorf("%s: Find(1000) found an epoch", name)
		}
	}
	check("with hello frames", buf.Bytes())
	// A recording made before epochs were marked: steps going back start the second one.
	var old bytes.Buffer
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		if !strings.HasPrefix(line, `{"type":"hello"`) {
			old.WriteString(line)
		}
	}
	check("without hello frames", old.Bytes())
}

// The player seeks within the epoch it is playing.
func TestPlayerSeeksWithinItsEpoch(t *testing.T) {
	var buf bytes.Buffer
	rec := NewRecorder(nopCloser{&buf})
	liveInto(t, rec, 0, 3, 160)
	second := liveInto(t, rec, 1, 5, 300)
	rec.Close()
	r, err := Load(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		p := NewPlayer(r, "restart.jsonl", PlayerOptions{Paused: true})
		go p.Run(t.Context())
		defer p.Close()
		for _, seek := range []int{250, 55} { // 250 is only in epoch 1; 55 in both
			if err := p.Control(feed.Control{Op: feed.ControlSeek, N: seek}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			u := p.Take()
			if u.Snapshot == nil {
				t.Fatalf("seek %d: no snapshot", seek)
			}
			v, err := engine.NewView(*u.Snapshot)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(v.Snapshot(), second[uint64(seek)]) {
				t.Errorf("seek to %d while in the second epoch: not the second run's state at that step", seek)
			}
		}
	})
}
