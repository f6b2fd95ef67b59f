package ui

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/record"
)

// probed is the dashboard in a program, and a way to look at it from the test while the
// program runs: a probeMsg has the program's goroutine describe what it draws.
type probed struct {
	*Model
	out chan drawn
}

type probeMsg struct{}

// drawn is what a dashboard shows: the state its panels draw and each panel's text at one
// size, the detail open on one request.
type drawn struct {
	snap    engine.Snapshot
	panels  map[panelID]string
	header  []string
	charts  []string
	step    uint64
	rewound bool
}

func (p probed) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	if _, ok := msg.(probeMsg); ok {
		p.out <- describeDrawn(p.Model, "")
		return p, nil
	}
	_, cmd := p.Model.Update(msg)
	return p, cmd
}

// describeDrawn renders every panel of m's drawn world at 120×40 (the detail open on
// detail, or on the first request), and reads the charts' titles at the step drawn.
func describeDrawn(m *Model, detail string) drawn {
	w := m.drawn()
	if w.view == nil {
		return drawn{}
	}
	d := drawn{snap: w.view.Snapshot(), panels: map[panelID]string{}, rewound: m.rw != nil}
	d.step, _ = m.drawnStep()
	if detail == "" && len(d.snap.Requests) > 0 {
		detail = d.snap.Requests[0].ID
	}
	saved := m.detail
	m.detail = m.detail.open(detail)
	for id := range numPanels {
		m.refreshPanel(id, w, 120, 40)
		d.panels[id] = ansi.Strip(m.panelView(id))
	}
	m.detail = saved
	d.header = strings.Split(ansi.Strip(m.header), "\n")
	k := m.series.len() - 1
	if m.rw != nil {
		k = m.series.index(m.rw.step)
	}
	for _, c := range charts {
		if k >= 0 { // no step had completed at the one drawn: the live dashboard had no charts
			d.charts = append(d.charts, ansi.Strip(m.charts.title(c, k)))
		}
	}
	return d
}

// liveAt is what a dashboard that received the script up to step n shows: the live view
// the rewound one must match.
func liveAt(t *testing.T, s *script, n uint64) drawn {
	t.Helper()
	m, _ := feedModel(t, nil, Options{Name: "test", Control: true}, 200, 60)
	snap := s.snap
	st := s.states[n]
	m.Update(updateMsg{feed.Update{Snapshot: &snap, Events: s.events[:st.end], Status: &feed.Status{Rate: 20, Target: 20, Controllable: true}}})
	return describeDrawn(m, "")
}

var rewindBadge = regexp.MustCompile(`REWIND step ([\d,]+) · live ([\d,]+) \(\+([\d,]+)\)`)

// The rewind, in a running program: the dashboard receives 300 steps of a scripted engine
// in batches, then [ ] { } : and L move through them. At every step it stops at, the state
// it draws is the engine's own snapshot at that step, every panel shows what a dashboard
// that had received the engine up to that step showed, the charts give that step's values,
// and the header says how far behind live it is. L goes back to live.
func TestRewindShowsTheStateAtThatStep(t *testing.T) {
	s := longRun(t)
	src := newFakeSource()
	// A bound of 1,000 steps checkpoints every 100: the rewinds start from checkpoints of
	// the dashboard's own as well as from the source's snapshot.
	folded := make(chan feed.Update, 1)
	m := New(src, Options{Name: "test", Control: true, History: feed.HistoryLimits{Steps: 1000},
		OnUpdate: func(u feed.Update) { folded <- u }})
	out := make(chan drawn)
	p := tea.NewProgram(probed{m, out}, tea.WithInput(nil), tea.WithOutput(&syncBuffer{}), tea.WithWindowSize(200, 60),
		tea.WithColorProfile(colorprofile.ASCII), tea.WithoutSignals())
	errc := make(chan error, 1)
	go func() { _, err := p.Run(); errc <- err }()
	defer src.Close()

	// The engine's 300 steps, a snapshot and then batches of events as a runner sends them,
	// each taken before the next comes.
	snap := s.snap
	src.push(feed.Update{Snapshot: &snap, Status: &feed.Status{Rate: 20, Target: 20, Controllable: true}})
	within(t, folded, "the snapshot")
	for from := 0; from < len(s.events); from += 300 {
		src.push(feed.Update{Events: s.events[from:min(from+300, len(s.events))]})
		within(t, folded, "a batch")
	}
	probe := func() drawn {
		p.Send(probeMsg{})
		return within(t, out, "the probe")
	}
	for d := probe(); d.step != 300 || d.rewound; d = probe() {
	}
	if h := m.hist.Snapshots(); h < 3 {
		t.Fatalf("the history holds %d snapshots after 300 steps with a checkpoint due every 100", h)
	}

	for _, tc := range []struct {
		keys []string
		step uint64
	}{
		{[]string{"{"}, 200},
		{[]string{"{"}, 100},
		{[]string{"["}, 99},
		{[]string{"[", "[", "["}, 96},
		{[]string{"]"}, 97},
		{[]string{"}"}, 197},
		{[]string{":", "1", "5", "0", "enter"}, 150}, // the abort and the start before the KV
		{[]string{":", "1", "7", "5", "enter"}, 175}, // blocked on the watermark
		{[]string{"{", "{", "{", "{"}, 0},
		{[]string{"]"}, 1},
	} {
		for _, k := range tc.keys {
			p.Send(keyMsg(k))
		}
		got := probe()
		name := fmt.Sprintf("after %v", tc.keys)
		if !got.rewound || got.step != tc.step {
			t.Fatalf("%s: rewound %v at step %d, want step %d", name, got.rewound, got.step, tc.step)
		}
		if want := s.states[tc.step].snap; !reflect.DeepEqual(got.snap, want) {
			t.Errorf("%s: the state drawn is not the engine's snapshot at step %d", name, tc.step)
		}
		want := liveAt(t, s, tc.step)
		for id := range numPanels {
			if id == panelCharts {
				continue // the rewound charts span all 300 steps; their titles are compared below
			}
			if got.panels[id] != want.panels[id] {
				t.Errorf("%s: the %s panel differs from the live one at step %d:\n got: %s\nwant: %s", name, panelNames[id], tc.step,
					firstDiff(got.panels[id], want.panels[id]), firstDiff(want.panels[id], got.panels[id]))
			}
		}
		if !reflect.DeepEqual(got.charts, want.charts) {
			t.Errorf("%s: the charts give\n%q\nwant the live ones at step %d\n%q", name, got.charts, tc.step, want.charts)
		}
		if got.header[1] != want.header[1] || got.header[2] != want.header[2] {
			t.Errorf("%s: the header's counts differ from the live ones:\n%s\n%s\nwant\n%s\n%s", name, got.header[1], got.header[2], want.header[1], want.header[2])
		}
		b := rewindBadge.FindStringSubmatch(got.header[0])
		if b == nil || b[1] != fmt.Sprint(humanizeComma(tc.step)) || b[2] != "300" || b[3] != humanizeComma(300-tc.step) {
			t.Errorf("%s: header %q, want REWIND step %d · live 300 (+%d)", name, got.header[0], tc.step, 300-tc.step)
		}
	}
	p.Send(keyMsg("L"))
	if got := probe(); got.rewound || got.step != 300 {
		t.Errorf("after L: rewound %v at step %d, want live at 300", got.rewound, got.step)
	}
	p.Quit()
	if err := within(t, errc, "the program to end"); err != nil {
		t.Fatal(err)
	}
}

// firstDiff returns the first line of a that b does not have at the same place.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i, l := range al {
		if i >= len(bl) || bl[i] != l {
			return fmt.Sprintf("line %d: %q", i, l)
		}
	}
	if len(bl) > len(al) {
		return fmt.Sprintf("line %d: (none)", len(al))
	}
	return "(same)"
}

func humanizeComma(n uint64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// The history is bounded: rewinding stops at the oldest step it holds, and says so; a
// source that starts over from an earlier step (another engine) empties it and ends the
// rewind.
func TestRewindWithinTheHistory(t *testing.T) {
	s := longRun(t)
	m, _ := feedModel(t, nil, Options{History: feed.HistoryLimits{Steps: 100}}, 120, 40)
	snap := s.snap
	m.Update(updateMsg{feed.Update{Snapshot: &snap}})
	for from := 0; from < len(s.events); from += 100 {
		m.Update(updateMsg{feed.Update{Events: s.events[from:min(from+100, len(s.events))]}})
	}
	first, last, _ := m.hist.Steps()
	if last != 300 || last-first > 100 || last-first < 80 {
		t.Fatalf("the history holds steps %d–%d, want the last 80 to 100", first, last)
	}
	press(m, "{", "{", "{")
	if m.rw == nil || m.rw.step != first {
		t.Fatalf("{ three times: rewound to %v, want the oldest step held, %d", m.rw, first)
	}
	if !reflect.DeepEqual(m.drawn().view.Snapshot(), s.states[first].snap) {
		t.Errorf("the oldest step held is not the engine's state at step %d", first)
	}
	press(m, "[")
	if m.rw.step != first || !strings.Contains(m.message, "the oldest the history holds") {
		t.Errorf("[ at the oldest step: at %d, message %q", m.rw.step, m.message)
	}
	press(m, ":", "1", "0", "enter")
	if m.rw.step != first {
		t.Errorf(": 10, before the history: at %d", m.rw.step)
	}
	// Another engine: its snapshot is at step 0.
	again := s.snap
	m.Update(updateMsg{feed.Update{Snapshot: &again}})
	if m.rw != nil || m.hist.Len() != 1 {
		t.Errorf("a snapshot from an earlier step: rewound %v, %d entries held; want live, the new snapshot alone", m.rw, m.hist.Len())
	}
}

// A new connection starts a new history: the steps it brings may be another run's, even
// when they do not go back. R records the epoch it holds as that epoch.
func TestRewindAcrossConnections(t *testing.T) {
	s := longRun(t)
	var file buffer
	m, _ := feedModel(t, nil, Options{Record: func() (Recorder, string, error) {
		return record.NewRecorder(&file), "epochs.jsonl", nil
	}}, 120, 40)
	snap := s.snap
	m.Update(updateMsg{feed.Update{Snapshot: &snap, Events: s.events[:s.states[100].end]}})
	press(m, "{")
	if m.rw == nil {
		t.Fatal("{ did not rewind")
	}
	at100 := s.states[100].snap
	m.Update(updateMsg{feed.Update{Snapshot: &at100, Events: s.events[s.states[100].end:s.states[150].end], Epoch: 1}})
	first, last, _ := m.hist.Steps()
	if m.rw != nil || first != 100 || last != 150 || m.series.len() != 50 {
		t.Errorf("after a reconnection at step 100: rewound %v, history %d–%d, %d samples; want live, 100–150, 50", m.rw != nil, first, last, m.series.len())
	}
	press(m, "R")
	if err := m.finishRecording(); err != nil {
		t.Fatal(err)
	}
	rec, err := record.Load(strings.NewReader(file.String()))
	if err != nil {
		t.Fatal(err)
	}
	if es := rec.Epochs(); len(es) != 1 || es[0].First != 100 || es[0].Last != 150 {
		t.Errorf("the recording's epochs: %+v, want one, steps 100–150", es)
	}
}
