package ui

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// press sends keys to the model directly and runs what they return: a key returns at most
// one command, a control (which answers at once here) or tea.Quit.
func press(m *Model, keys ...string) {
	for _, k := range keys {
		_, cmd := m.Update(keyMsg(k))
		if cmd == nil {
			continue
		}
		switch msg := cmd().(type) {
		case controlDoneMsg, seekMsg:
			m.Update(msg)
		}
	}
}

// controls drains the controls a fake source received.
func controls(src *fakeSource) []feed.Control {
	var out []feed.Control
	for {
		select {
		case c := <-src.controls:
			out = append(out, c)
		default:
			return out
		}
	}
}

func screen(m *Model) string { return ansi.Strip(m.View().Content) }

func TestPanelSwitching(t *testing.T) {
	m, _ := feedModel(t, watermark(t), Options{}, 100, 30)
	want := func(p panelID) {
		t.Helper()
		if m.active != p {
			t.Fatalf("active panel = %s, want %s", panelNames[m.active], panelNames[p])
		}
	}
	want(panelRequests)
	press(m, "tab")
	want(panelPages)
	press(m, "tab", "tab", "tab", "tab")
	want(panelDetail)
	press(m, "tab")
	want(panelCharts)
	press(m, "tab")
	want(panelRequests)
	press(m, "shift+tab")
	want(panelCharts)
	for i := range numPanels {
		press(m, fmt.Sprint(int(i)+1))
		want(i)
		if !strings.Contains(screen(m), fmt.Sprintf(" %d %s ", int(i)+1, panelNames[i])) {
			t.Errorf("panel %d: tab bar missing", i+1)
		}
	}
}

func TestDetailEnterEsc(t *testing.T) {
	m, _ := feedModel(t, watermark(t), Options{}, 100, 40)
	// Stuck first: the watermark-blocked head is the first row.
	if got := m.requests.selected(); got != "r-37" {
		t.Fatalf("selected = %q, want r-37 (the blocked head, stuck first)", got)
	}
	press(m, "enter")
	if m.active != panelDetail || m.detail.id != "r-37" {
		t.Fatalf("enter: panel %s, detail %q; want detail of r-37", panelNames[m.active], m.detail.id)
	}
	s := screen(m)
	for _, want := range []string{"watermark: needs 3 + 400 pages, 402 free", "✗ watermark", "403 > 402", "← blocks"} {
		if !strings.Contains(s, want) {
			t.Errorf("detail lacks %q:\n%s", want, s)
		}
	}
	press(m, "esc")
	if m.active != panelRequests {
		t.Fatalf("esc: panel %s, want requests", panelNames[m.active])
	}
	// A request behind the head says so and shows the head's reason.
	press(m, "j", "enter")
	if !strings.Contains(screen(m), "head-of-line: behind r-37") {
		t.Errorf("r-38's detail does not say it waits behind r-37:\n%s", screen(m))
	}
}

func TestFilter(t *testing.T) {
	m, _ := feedModel(t, busy(t), Options{}, 120, 60)
	ids := func() []string {
		var out []string
		for i := range m.requests.rows {
			out = append(out, m.requests.row(i).r.ID)
		}
		return out
	}
	press(m, "/", "a", "-", "[", "0", "3", "]", "enter")
	if got := ids(); len(got) != 2 || got[0] != "a-0" || got[1] != "a-3" {
		t.Fatalf("filter a-[03]: rows %v, want [a-0 a-3]", got)
	}
	if m.filterInput.Focused() {
		t.Fatal("enter did not close the filter prompt")
	}
	// Inverted.
	press(m, "/", "backspace", "backspace", "backspace", "backspace", "backspace", "backspace", "!", "b", "-", "enter")
	for _, id := range ids() {
		if strings.HasPrefix(id, "b-") {
			t.Fatalf("filter !b-: row %s shown", id)
		}
	}
	if n := len(ids()); n != 6 {
		t.Errorf("filter !b-: %d rows, want the 6 a-* requests", n)
	}
	// Matches the why column too.
	press(m, "esc", "/", "watermark", "enter")
	if got := ids(); len(got) != 1 || got[0] != "b-24" {
		t.Errorf("filter watermark: rows %v, want [b-24]", got)
	}
	// A bad expression is reported and keeps the last good filter.
	press(m, "/", "(")
	if !m.messageErr || !strings.Contains(m.message, "bad filter") {
		t.Errorf("bad regex: message %q", m.message)
	}
	press(m, "esc")
	if n := len(ids()); n != 40 {
		t.Errorf("after esc: %d rows, want all 40", n)
	}
	// The event log filters too.
	press(m, "5", "/", "hazard_detected", "enter")
	if n := len(m.events.idx); n != 3 { // start-before-kv, abort-leak, fork-unreceived
		t.Errorf("events filtered on hazard_detected: %d, want 3", n)
	}
}

func TestSort(t *testing.T) {
	m, _ := feedModel(t, busy(t), Options{}, 120, 60)
	first := func() string { return m.requests.row(0).r.ID }
	if first() != "b-24" {
		t.Errorf("stuck first: first row %s, want b-24", first())
	}
	press(m, "s")
	if m.requests.sort != sortArrival || first() != "a-0" {
		t.Errorf("sort arrival: first row %s", first())
	}
	press(m, "s", "s") // age, pages
	if m.requests.sort != sortPages {
		t.Fatalf("sort = %v, want pages", m.requests.sort)
	}
	rp := &m.requests
	for i := 1; i < len(rp.rows); i++ {
		if rp.row(i).pages > rp.row(i-1).pages {
			t.Fatalf("sorted by pages: row %d holds %d > row %d's %d", i, rp.row(i).pages, i-1, rp.row(i-1).pages)
		}
	}
	press(m, "S")
	rp = &m.requests
	for i := 1; i < len(rp.rows); i++ {
		if rp.row(i).pages < rp.row(i-1).pages {
			t.Fatalf("reversed: row %d holds %d < row %d's %d", i, rp.row(i).pages, i-1, rp.row(i-1).pages)
		}
	}
	press(m, "2", "s")
	if m.message != "sort works in the requests panel" {
		t.Errorf("s in the page map: message %q", m.message)
	}
}

func TestPauseFreezesView(t *testing.T) {
	s := watermark(t)
	m, src := feedModel(t, s, Options{Control: true}, 100, 30)
	press(m, "p")
	if m.frozen == nil {
		t.Fatal("p did not freeze the view")
	}
	if got := controls(src); len(got) != 1 || got[0].Op != feed.ControlPause {
		t.Fatalf("controls after p = %v, want pause", got)
	}
	before := m.drawn().view.Stamp()
	mark := s.mark()
	s.receive("r-00", 1, 1).step(2)
	m.Update(updateMsg{s.delta(mark)})
	if got := m.drawn().view.Stamp(); got != before {
		t.Errorf("frozen view moved from %v to %v", before, got)
	}
	if got := m.live.view.Stamp(); got == before {
		t.Error("live view did not take the update while frozen")
	}
	if !strings.Contains(screen(m), "PAUSED +") {
		t.Errorf("no PAUSED badge with the events behind:\n%s", screen(m))
	}
	if r, _ := m.drawn().view.Request("r-00"); r.Received != 0 {
		t.Errorf("frozen r-00 received %d, want 0", r.Received)
	}
	press(m, "p")
	if m.frozen != nil {
		t.Fatal("second p did not resume")
	}
	if got := controls(src); len(got) != 1 || got[0].Op != feed.ControlResume {
		t.Fatalf("controls after second p = %v, want resume", got)
	}
	if r, _ := m.drawn().view.Request("r-00"); r.Received != 39 {
		t.Errorf("resumed r-00 received %d, want 39", r.Received)
	}
}

func TestPauseReadOnly(t *testing.T) {
	m, src := feedModel(t, watermark(t), Options{Control: false}, 100, 30)
	press(m, "p")
	if m.frozen == nil {
		t.Fatal("p did not freeze a read-only view")
	}
	if got := controls(src); len(got) != 0 {
		t.Errorf("read-only pause sent %v", got)
	}
	press(m, "n")
	if !m.messageErr || !strings.Contains(m.message, "single step refused") {
		t.Errorf("n when read-only: message %q", m.message)
	}
	press(m, "space")
	if got := controls(src); len(got) != 0 {
		t.Errorf("read-only step sent %v", got)
	}
	if !strings.Contains(screen(m), "single step refused") {
		t.Error("the refusal is not on the screen")
	}
	// Resync is allowed read-only.
	press(m, "r")
	if got := controls(src); len(got) != 1 || got[0].Op != feed.ControlSnapshot {
		t.Errorf("r sent %v, want snapshot", got)
	}
}

func TestStatusOverridesControl(t *testing.T) {
	m, src := feedModel(t, watermark(t), Options{Control: true}, 100, 30)
	m.Update(updateMsg{feed.Update{Status: &feed.Status{Controllable: false}}})
	press(m, "n")
	if got := controls(src); len(got) != 0 || !m.messageErr {
		t.Errorf("step with a status saying read-only: sent %v, message %q", got, m.message)
	}
}

func TestSingleStepWhileFrozen(t *testing.T) {
	s := watermark(t)
	m, src := feedModel(t, s, Options{Control: true}, 100, 30)
	press(m, "p", "n")
	got := controls(src)
	if len(got) != 2 || got[1] != (feed.Control{Op: feed.ControlStep, N: 1}) {
		t.Fatalf("controls = %v, want pause, step 1", got)
	}
	mark := s.mark()
	s.step(1)
	m.Update(updateMsg{s.delta(mark)})
	if m.frozen == nil {
		t.Fatal("the step thawed the view")
	}
	if got, want := m.drawn().view.Stamp().Step, s.e.StepNumber(); got != want {
		t.Errorf("frozen view at step %d after a single step, want %d", got, want)
	}
}

func TestControlRefused(t *testing.T) {
	m, src := feedModel(t, watermark(t), Options{Control: true}, 100, 30)
	src.readOnly = true
	press(m, "n")
	if !m.messageErr || !strings.Contains(m.message, "read-only") {
		t.Errorf("a refused control: message %q", m.message)
	}
}

func TestDivergedAsksForSnapshot(t *testing.T) {
	s := watermark(t)
	m, src := feedModel(t, s, Options{}, 100, 30)
	cmd := m.fold(feed.Update{Events: []engine.Event{engine.KVReceived{ID: "nobody", Received: 1, Reserved: 1}}})
	if m.diverged == nil || !errors.Is(m.diverged, engine.ErrDiverged) {
		t.Fatalf("diverged = %v, want ErrDiverged", m.diverged)
	}
	if cmd == nil {
		t.Fatal("no resync asked")
	}
	cmd()
	if got := controls(src); len(got) != 1 || got[0].Op != feed.ControlSnapshot {
		t.Fatalf("controls = %v, want snapshot", got)
	}
	m.refresh()
	if !strings.Contains(screen(m), "VIEW DIVERGED") {
		t.Error("the divergence is not on the screen")
	}
	snap := s.e.Snapshot()
	m.Update(updateMsg{feed.Update{Snapshot: &snap}})
	if m.diverged != nil {
		t.Errorf("a snapshot did not clear the divergence: %v", m.diverged)
	}
}

func TestOnUpdateSeesEveryUpdate(t *testing.T) {
	var got []feed.Update
	s := watermark(t)
	m, _ := feedModel(t, nil, Options{OnUpdate: func(u feed.Update) { got = append(got, u) }}, 100, 30)
	u := s.update()
	m.Update(updateMsg{u})
	m.Update(sourceDoneMsg{feed.Update{}})
	if len(got) != 2 || got[0].Snapshot != u.Snapshot || len(got[0].Events) != len(u.Events) {
		t.Fatalf("OnUpdate saw %d updates, want 2 with the first as sent", len(got))
	}
	if !m.closed || !strings.Contains(screen(m), "source ended") {
		t.Error("the end of the source is not shown")
	}
}

func TestEventLogBounded(t *testing.T) {
	m, _ := feedModel(t, watermark(t), Options{EventLog: 100}, 100, 30)
	for i := range 50 {
		evs := make([]engine.Event, 100)
		for j := range evs {
			evs[j] = engine.StepCompleted{Stamp: engine.Stamp{Step: uint64(i*100 + j + 10)}}
		}
		m.Update(updateMsg{feed.Update{Events: evs}})
	}
	if n := m.live.events.len(); n != 100 {
		t.Errorf("log holds %d, want 100", n)
	}
	if m.live.events.total != uint64(5000+len(watermark(t).events)) {
		t.Errorf("log counted %d", m.live.events.total)
	}
	if got := m.live.events.at(99).ev.When().Step; got != 5009 {
		t.Errorf("newest entry at step %d, want 5009", got)
	}
}

func TestIdleDoesNotRedraw(t *testing.T) {
	m, _ := feedModel(t, busy(t), Options{}, 120, 40)
	frames, out := m.frames, m.requests.out
	for range 5 {
		m.Update(linkTickMsg{})
		m.Update(frameMsg{})
	}
	if m.frames != frames {
		t.Errorf("%d frames built with nothing changing", m.frames-frames)
	}
	if m.requests.out != out {
		t.Error("the requests panel re-rendered with nothing changing")
	}
}

func TestLinkStates(t *testing.T) {
	m, src := feedModel(t, watermark(t), Options{}, 120, 30)
	src.link = feed.Link{Name: "10.0.0.7:7070", State: feed.LinkReconnecting, Attempts: 3, Err: "connection refused"}
	m.Update(linkTickMsg{})
	s := screen(m)
	if !strings.Contains(s, "reconnecting (attempt 3): connection refused") || !strings.Contains(s, "10.0.0.7:7070") {
		t.Errorf("reconnecting link not shown:\n%s", s)
	}
	m.Update(updateMsg{feed.Update{Dropped: 1234}})
	if !strings.Contains(screen(m), "dropped 1,234") {
		t.Error("dropped frames not shown")
	}
}

func TestResize(t *testing.T) {
	m, _ := feedModel(t, busy(t), Options{}, 80, 24)
	for _, sz := range [][2]int{{200, 60}, {60, 15}, {80, 24}, {150, 40}} {
		m.Update(sizeMsg(sz[0], sz[1]))
		for p := range numPanels {
			press(m, fmt.Sprint(int(p)+1))
			checkSize(t, screen(m), sz[0], sz[1])
		}
	}
}

func TestPageMapMarksSelection(t *testing.T) {
	m, _ := feedModel(t, busy(t), Options{}, 200, 50)
	m.Update(keyMsg("/"))
	press(m, "b", "-", "0", "3", "enter")
	if m.requests.selected() != "b-03" {
		t.Fatalf("selected %q", m.requests.selected())
	}
	if m.pagemap.markCount != 6 || !strings.Contains(screen(m), "b-03's 6 pages marked") {
		t.Errorf("b-03's pages are not marked beside the table (%d marked)", m.pagemap.markCount)
	}
	// Enter on a page opens its owner.
	press(m, "esc", "2", "end")
	m.pagemap.cursor = 12 // a-4's leaked page
	press(m, "enter")
	if m.active != panelDetail || m.detail.id != "a-4" {
		t.Errorf("enter on page 12: %s of %q, want a-4's detail", panelNames[m.active], m.detail.id)
	}
}

// width agrees with ansi.StringWidth on the dashboard's text, its fast path's symbols
// (each alone, and among other text) and what falls outside them.
func TestWidth(t *testing.T) {
	cases := []string{"", "abc", "\x1b[1mab\x1b[0m c", "a·b", "\x1b[38;5;2m█\x1b[m", "r-37 blocked", "\x1b]8;;x\x07link",
		"⣿⣷⠒ free", "╭─ 1 requests ─╮", "┏━━┓ ◆ ● ┄", "steps 238–246: decode ×9…", "日本", "e\u0301", "◽◾", "👍"}
	for _, r := range [][2]rune{{0xa0, 0x2fff}} {
		for c := r[0]; c <= r[1]; c++ {
			if narrow(c) {
				cases = append(cases, string(c), "x"+string(c)+"\x1b[1m"+string(c)+"y")
			}
		}
	}
	for _, s := range cases {
		if got, want := width(s), ansi.StringWidth(s); got != want {
			t.Errorf("width(%q) = %d, want %d", s, got, want)
		}
	}
}

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		in   string
		w    int
		want []string
	}{
		{"", 10, []string{""}},
		{"a b c", 10, []string{"a b c"}},
		{"needs 3 + 400 pages, 257 free", 12, []string{"needs 3 +", "400 pages,", "257 free"}},
		{"averyveryverylongword x", 5, []string{"averyveryverylongword", "x"}},
	} {
		got := wrap(tc.in, tc.w)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.in, tc.w, got, tc.want)
		}
	}
}
