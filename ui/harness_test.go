package ui

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/pages"
	"github.com/kvtop/kvtop/feed"
)

// fakeSource is a Source fed by a test through a feed.Mailbox, as the real producers feed
// theirs; controls are recorded.
type fakeSource struct {
	*feed.Mailbox // C, Take and Close
	mu            sync.Mutex
	readOnly      bool
	link          feed.Link
	controls      chan feed.Control
}

func newFakeSource() *fakeSource {
	return &fakeSource{
		Mailbox:  feed.NewMailbox(0),
		link:     feed.Link{Name: "embedded", State: feed.LinkUp},
		controls: make(chan feed.Control, 64),
	}
}

// push delivers u's snapshot, events and status, as a producer does.
func (f *fakeSource) push(u feed.Update) {
	if u.Snapshot != nil {
		f.Snapshot(u.Snapshot)
	}
	f.Offer(u.Events)
	if u.Status != nil {
		f.SetStatus(*u.Status)
	}
}

func (f *fakeSource) Control(c feed.Control) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if f.readOnly && c.Op != feed.ControlSnapshot {
		return feed.ErrReadOnly
	}
	f.controls <- c
	return nil
}

func (f *fakeSource) Link() feed.Link {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.link
}

// script drives a real engine deterministically: fixed times, prompts made from the
// request id, so the events (and the goldens drawn from them) never change.
type script struct {
	tb     testing.TB
	e      *engine.Engine
	at     int64 // ms since the Unix epoch
	snap   engine.Snapshot
	events []engine.Event
	meta   map[string]engine.MetadataEmitted
	got    map[string]int // slots written so far, by request
	// states, when set, records the engine at each step: its snapshot once the calls
	// after the step are in, and how many events had come by then.
	states map[uint64]stepState
}

// stepState is the engine at a step, as a script recorded it.
type stepState struct {
	snap engine.Snapshot
	end  int // len(events)
}

// record notes the engine's state at its current step.
func (s *script) record() {
	if s.states != nil {
		s.states[s.e.StepNumber()] = stepState{snap: s.e.Snapshot(), end: len(s.events)}
	}
}

const t0 = 1_700_000_000_000

func newScript(tb testing.TB, mutate func(*engine.Config)) *script {
	tb.Helper()
	cfg := engine.DefaultConfig()
	cfg.MaxTotalSequenceLength = 8192
	cfg.MaxSingleSequenceLength = 8192
	if mutate != nil {
		mutate(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	s := &script{tb: tb, e: e, at: t0, meta: make(map[string]engine.MetadataEmitted), got: make(map[string]int)}
	s.snap = e.Snapshot()
	return s
}

func (s *script) now() time.Time { return time.UnixMilli(s.at) }

// tick moves engine time on.
func (s *script) tick(ms int64) *script { s.at += ms; return s }

func (s *script) collect(evs []engine.Event) {
	for _, ev := range evs {
		if md, ok := ev.(engine.MetadataEmitted); ok {
			s.meta[md.ID] = md
		}
	}
	s.events = append(s.events, evs...)
}

// prompt returns n tokens; the first shared of them are common to every prompt made with
// the same shared count, the rest depend on the id.
func prompt(id string, n, shared int) []int32 {
	p := make([]int32, n)
	h := int32(7)
	for _, c := range id {
		h = h*31 + c
	}
	for i := range p {
		if i < shared {
			p[i] = int32(1000 + i)
		} else {
			p[i] = 2000 + (h*97+int32(i)*13)%20000
			if p[i] < 0 {
				p[i] = -p[i]
			}
		}
	}
	return p
}

func (s *script) prep(id string, n, shared, maxTokens int) *script {
	s.tb.Helper()
	err := s.e.PrepRecv(s.now(), engine.PrepRecv{ID: id, Prompt: prompt(id, n, shared), End: -1, HasEnd: true, MaxTokens: maxTokens})
	if err != nil {
		s.tb.Fatal(err)
	}
	s.collect(s.e.TakeEvents())
	return s
}

func (s *script) step(n int) *script {
	for range n {
		s.record()
		s.tick(10)
		rd := s.e.Step(s.now())
		s.collect(rd.Events)
	}
	return s
}

// receive writes a request's reserved slots up to num/den of them, in order.
func (s *script) receive(id string, num, den int) *script {
	s.tb.Helper()
	md, ok := s.meta[id]
	if !ok {
		s.tb.Fatalf("receive %s: no metadata", id)
	}
	slots := pages.Expand(nil, md.Runs[0])
	k := len(slots) * num / den
	from := s.got[id]
	if k <= from {
		return s
	}
	s.got[id] = k
	if _, err := s.e.ReceiveKV(s.now(), slots[from:k], nil); err != nil {
		s.tb.Fatal(err)
	}
	s.collect(s.e.TakeEvents())
	return s
}

func (s *script) start(id string) *script {
	s.tb.Helper()
	if err := s.e.StartGenerate(s.now(), id, -1); err != nil {
		s.tb.Fatal(err)
	}
	s.collect(s.e.TakeEvents())
	return s
}

func (s *script) abort(id string) *script {
	s.tb.Helper()
	if err := s.e.Abort(s.now(), id); err != nil {
		s.tb.Fatal(err)
	}
	s.collect(s.e.TakeEvents())
	return s
}

// update is everything so far as one update: the first snapshot and every event since.
func (s *script) update() feed.Update {
	snap := s.snap
	return feed.Update{Snapshot: &snap, Events: s.events,
		Status: &feed.Status{Rate: 20, Target: 20, Controllable: true}}
}

// watermark is spec 9 example 8: 513 pages, 40 prompts of 40 tokens; 37 are admitted in
// one step and the 38th blocks on the watermark (3 + 400 pages, 402 free) with every later
// one behind it.
func watermark(tb testing.TB) *script {
	s := newScript(tb, nil)
	for i := range 40 {
		s.prep(fmt.Sprintf("r-%02d", i), 40, 0, 16)
	}
	return s.step(1)
}

// neverAdmitted is MLC's default capacity: 4,096 tokens give 257 pages, and the 400-page
// watermark admits nothing, ever.
func neverAdmitted(tb testing.TB) *script {
	s := newScript(tb, func(c *engine.Config) {
		c.MaxTotalSequenceLength = 4096
		c.MaxSingleSequenceLength = 4096
	})
	for i := range 3 {
		s.prep(fmt.Sprintf("r-%d", i), 40, 0, 16)
	}
	return s.step(1)
}

// busy is a decode instance in the middle of things: requests sharing a prefix (forks),
// KV arriving in part, requests decoding, finished ones recycling, a prepared request
// aborted (leaked), a start before the KV arrived (hazard), and the watermark blocking the
// queue.
func busy(tb testing.TB) *script {
	s := newScript(tb, nil)
	for i := range 6 {
		s.prep(fmt.Sprintf("a-%d", i), 40, 20, 4)
	}
	s.step(1)
	for i := range 4 {
		s.receive(fmt.Sprintf("a-%d", i), 1, 1)
	}
	s.receive("a-4", 1, 2)
	s.start("a-0").start("a-1").start("a-2")
	s.step(3)
	s.start("a-3")
	s.step(4)      // a-0…a-2 finish: recycled
	s.start("a-5") // before its KV: hazard
	s.abort("a-4") // prepared: leaks
	for i := range 34 {
		s.prep(fmt.Sprintf("b-%02d", i), 40+i%5*16, 20, 8)
	}
	s.tick(500).step(2)
	for i := range 6 {
		s.receive(fmt.Sprintf("b-%02d", i), i+1, 6)
	}
	return s
}

// feedModel builds a model on a fake source and folds s's update into it, at a size.
func feedModel(tb testing.TB, s *script, opts Options, w, h int) (*Model, *fakeSource) {
	tb.Helper()
	src := newFakeSource()
	m := New(src, opts)
	m.Update(sizeMsg(w, h))
	if s != nil {
		m.Update(updateMsg{s.update()})
	}
	return m, src
}

// mark returns how many events the script has made, for delta.
func (s *script) mark() int { return len(s.events) }

// delta is the events made since a mark, as one update.
func (s *script) delta(from int) feed.Update {
	return feed.Update{Events: append([]engine.Event(nil), s.events[from:]...)}
}

func sizeMsg(w, h int) tea.WindowSizeMsg { return tea.WindowSizeMsg{Width: w, Height: h} }

// keyMsg is the key press a terminal sends for a key name.
func keyMsg(s string) tea.KeyPressMsg {
	switch s {
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "tab":
		return tea.KeyPressMsg{Code: tea.KeyTab}
	case "shift+tab":
		return tea.KeyPressMsg{Code: tea.KeyTab, Mod: tea.ModShift}
	case "end":
		return tea.KeyPressMsg{Code: tea.KeyEnd}
	case "up":
		return tea.KeyPressMsg{Code: tea.KeyUp}
	case "down":
		return tea.KeyPressMsg{Code: tea.KeyDown}
	case "space":
		return tea.KeyPressMsg{Code: tea.KeySpace, Text: " "}
	case "backspace":
		return tea.KeyPressMsg{Code: tea.KeyBackspace}
	}
	r := []rune(s)
	return tea.KeyPressMsg{Code: r[0], Text: s}
}

// firstAdmitted returns the k-th of ids that has been admitted, "" if none.
func firstAdmitted(s *script, ids []string, k int) string {
	for _, id := range ids {
		if _, ok := s.meta[id]; ok {
			if k == 0 {
				return id
			}
			k--
		}
	}
	return ""
}

// longRun is a decode instance over 300 steps, for the history charts and the rewind: two
// requests arrive every third step, their KV comes a step later and they start, decode a
// few tokens and finish; from step 110 to 185 the prefill instance stops writing, so
// prepared requests pile up awaiting KV until the watermark blocks the queue; at step 150
// a prepared request is aborted (it leaks) and one is started before its KV (hazards);
// then the writes resume and the backlog drains.
//
// It is built once and shared: the tests only read it.
func longRun(tb testing.TB) *script {
	tb.Helper()
	longRunOnce.Do(func() { longRunScript = buildLongRun(tb) })
	if longRunScript == nil {
		tb.Fatal("the long run did not build")
	}
	return longRunScript
}

var (
	longRunOnce   sync.Once
	longRunScript *script
)

func buildLongRun(tb testing.TB) *script {
	s := newScript(tb, func(c *engine.Config) {
		c.MaxTotalSequenceLength = 16384 // 1,025 pages
		c.MaxRecycling = 8
	})
	s.states = map[uint64]stepState{}
	n := 0
	var prepared []string // admitted, KV not written yet
	for step := 1; step <= 300; step++ {
		if step%3 == 0 && step < 260 {
			for range 2 {
				n++
				s.prep(fmt.Sprintf("l-%03d", n), 160+n%4*64, 20, 4+n%5)
				prepared = append(prepared, fmt.Sprintf("l-%03d", n))
			}
		}
		if step == 150 {
			// The two oldest admitted: one aborted, one started before its KV.
			aborted, started := firstAdmitted(s, prepared, 0), firstAdmitted(s, prepared, 1)
			s.abort(aborted).start(started)
			prepared = slices.DeleteFunc(prepared, func(id string) bool { return id == aborted || id == started })
		}
		stalled := step >= 110 && step < 185
		var still []string
		for _, id := range prepared {
			if _, admitted := s.meta[id]; !admitted || stalled {
				still = append(still, id)
				continue
			}
			s.receive(id, 1, 1).start(id)
		}
		prepared = still
		s.tick(40).step(1)
	}
	s.record()
	return s
}
