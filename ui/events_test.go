package ui

import (
	"strings"
	"testing"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// Routine events are folded a run of steps a line, with what the steps did; a shows them
// all; the other events are untouched either way.
func TestEventsFoldRoutineSteps(t *testing.T) {
	s := longRun(t)
	m, _ := feedModel(t, s, Options{EventLog: 4096}, 120, 40)
	press(m, "5")
	// The last 37 steps are idle but one: one line.
	if s := screen(m); !strings.Contains(s, "steps 264–300: decode ×1, idle ×36") {
		t.Errorf("the idle tail is not one folded line:\n%s", s)
	}
	// Every run of routine events, and only those, is one line: a folded line holds
	// routine events alone, no two are next to each other, and the lines hold the log.
	folded := len(m.events.rows)
	covered := 0
	for i, r := range m.events.rows {
		covered += r.to - r.from
		if r.kind != rowFold {
			if routine(m.live.events.at(m.events.idx[r.from])) {
				t.Fatalf("line %d is a routine event on its own", i)
			}
			continue
		}
		for _, j := range m.events.idx[r.from:r.to] {
			if !routine(m.live.events.at(j)) {
				t.Fatalf("folded line %d holds %s", i, m.live.events.line(j))
			}
		}
		if i > 0 && m.events.rows[i-1].kind == rowFold {
			t.Fatalf("folded lines %d and %d are next to each other", i-1, i)
		}
	}
	if covered != m.live.events.len() || folded >= covered {
		t.Errorf("%d lines hold %d events of %d", folded, covered, m.live.events.len())
	}
	press(m, "a")
	if all := len(m.events.rows); all != m.live.events.len() {
		t.Errorf("a: %d lines for %d events", all, m.live.events.len())
	}
	if !strings.Contains(screen(m), "step_completed") {
		t.Error("a does not show the step summaries")
	}
	press(m, "a")
	if len(m.events.rows) != folded {
		t.Errorf("a twice: %d lines, want %d", len(m.events.rows), folded)
	}
}

// i groups the log by request, each under its heading, the engine's own events last;
// enter on a heading opens that request.
func TestEventsByRequest(t *testing.T) {
	m, _ := feedModel(t, busy(t), Options{}, 120, 40)
	press(m, "5", "i")
	r := m.events.rows
	if r[0].kind != rowHeading || r[0].id != "a-0" {
		t.Fatalf("the first line is %+v, want a-0's heading", r[0])
	}
	seen := map[string]bool{}
	var group string
	for _, row := range r {
		switch row.kind {
		case rowHeading:
			if seen[row.id] {
				t.Fatalf("%q has two groups", row.id)
			}
			seen[row.id], group = true, row.id
		case rowEntry:
			ev := m.live.events.at(m.events.idx[row.from]).ev
			if id, ok := engine.RequestOf(ev); ok && id != group {
				t.Fatalf("%s's event %q is under %q", id, ev, group)
			}
		}
	}
	if last := r[len(r)-1]; group != "" {
		t.Errorf("the last group is %q (last line %+v), want the engine's own", group, last)
	}
	press(m, "g", "enter")
	if m.active != panelDetail || m.detail.id != "a-0" {
		t.Errorf("enter on a-0's heading: %s of %q", panelNames[m.active], m.detail.id)
	}
}

// The dashboard's own trouble goes in the log, marked: a view that diverged, events lost;
// hazards are marked too.
func TestEventsMarkTrouble(t *testing.T) {
	s := busy(t)
	m, _ := feedModel(t, s, Options{}, 140, 40)
	press(m, "5", "/", "hazard|dashboard", "enter")
	for _, want := range []string{"!      8  hazard_detected  hazard start-before-kv a-5"} {
		if !strings.Contains(screen(m), want) {
			t.Errorf("hazards are not marked (%q):\n%s", want, screen(m))
		}
	}
	// An event that does not fit: the view diverged.
	m.Update(updateMsg{feed.Update{Events: []engine.Event{engine.RequestStarted{Stamp: engine.Stamp{Step: 11}, ID: "nobody"}}, Dropped: 3}})
	sc := screen(m)
	for _, want := range []string{"! ", "3 events lost", "the view diverged", "a fresh snapshot was asked for"} {
		if !strings.Contains(sc, want) {
			t.Errorf("the log lacks %q:\n%s", want, sc)
		}
	}
}
