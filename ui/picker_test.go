package ui

import (
	"context"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/kvtop/kvtop/engine"
)

// fakeFleet is a tap's fleet in a test: fixed rows, and a fake source for each instance.
type fakeFleet struct {
	rows   []FleetRow
	opened []string
	srcs   []*fakeSource
}

func (f *fakeFleet) Rows(context.Context) ([]FleetRow, error) {
	return append([]FleetRow{}, f.rows...), nil
}

func (f *fakeFleet) Open(_ context.Context, addr string) (Source, error) {
	f.opened = append(f.opened, addr)
	src := newFakeSource()
	e, _ := engine.New(engine.DefaultConfig())
	e.Follow()
	snap := e.Snapshot()
	src.Snapshot(&snap)
	f.srcs = append(f.srcs, src)
	return src, nil
}

// run feeds a message to the picker and runs the commands it returns that are ready
// now (the ones that wait on time are left).
func runPicker(t *testing.T, p *Picker, msg tea.Msg) {
	t.Helper()
	queue := []tea.Msg{msg}
	for n := 0; len(queue) > 0 && n < 50; n++ {
		m := queue[0]
		queue = queue[1:]
		_, cmd := p.Update(m)
		queue = append(queue, ready(cmd)...)
	}
}

// ready runs a command unless it waits (ticks, the source): those are dropped.
func ready(cmd tea.Cmd) []tea.Msg {
	if cmd == nil {
		return nil
	}
	done := make(chan tea.Msg, 1)
	go func() { done <- cmd() }()
	select {
	case msg := <-done:
		if b, ok := msg.(tea.BatchMsg); ok {
			var out []tea.Msg
			for _, c := range b {
				out = append(out, ready(c)...)
			}
			return out
		}
		return []tea.Msg{msg}
	case <-time.After(50 * time.Millisecond):
		return nil
	}
}

// The fleet table lists every decode instance with its numbers; s sorts it; enter opens
// the instance under the cursor in a dashboard whose header says it is a shadow; esc there
// comes back to the table.
func TestPickerListsOpensAndComesBack(t *testing.T) {
	f := &fakeFleet{rows: []FleetRow{
		{Address: "d0:8000", Role: "decode", Waiting: 1, Used: 20, Free: 493, Standing: "exact since step 0"},
		{Address: "d1:8000", Role: "decode", Waiting: 7, Stuck: 7, Used: 600, Free: 425, Head: "r12", Why: "watermark 439 > 430 free", Oldest: 12 * time.Second, Divergences: 3},
		{Address: "p0:9000", Role: "prefill"},
	}}
	p := NewPicker(f, Options{NoColor: true})
	runPicker(t, p, tea.WindowSizeMsg{Width: 160, Height: 30})
	runPicker(t, p, p.Init()())
	view := ansi.Strip(p.View().Content)
	for _, want := range []string{"3 instances", "sorted by stuck", "d1:8000", "r12: watermark 439 > 430 free", "exact since step 0", "12s"} {
		if !strings.Contains(view, want) {
			t.Errorf("the table lacks %q:\n%s", want, view)
		}
	}
	if lines := strings.Split(view, "\n"); !strings.Contains(lines[3], "▸") || !strings.Contains(lines[3], "d1:8000") {
		t.Errorf("the stuck instance is not first, under the cursor:\n%s", view)
	}
	runPicker(t, p, keyMsg("s"))
	if view := ansi.Strip(p.View().Content); !strings.Contains(view, "sorted by waiting") {
		t.Errorf("after s:\n%s", view)
	}
	runPicker(t, p, keyMsg("down"))
	runPicker(t, p, keyMsg("enter"))
	if len(f.opened) != 1 || f.opened[0] != "d0:8000" || p.inner == nil {
		t.Fatalf("opened %v, want d0:8000", f.opened)
	}
	if view := ansi.Strip(p.View().Content); !strings.Contains(view, "tap · d0:8000") || !strings.Contains(view, "shadow: exact since step 0") {
		t.Errorf("the instance's dashboard:\n%s", view)
	}
	runPicker(t, p, keyMsg("esc"))
	if p.inner != nil {
		t.Fatal("esc did not come back to the table")
	}
	if view := ansi.Strip(p.View().Content); !strings.Contains(view, "INSTANCE") {
		t.Errorf("back at the table:\n%s", view)
	}
}
