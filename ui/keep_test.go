package ui

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
	"github.com/kvtop/kvtop/internal/lockstep"
	"github.com/kvtop/kvtop/sim"
)

// The request rows and the page map's cells are kept current from what changed (the rows of
// the requests whose version moved, the cells of the pages the page map says changed); in
// every scenario, after every step, they are what panels made from scratch on the same
// world show: the same rows in the same order with the same counts, under each sort and
// with a filter on and off, and the same cells.
func TestRowsAndCellsKeptAreMadeFromScratch(t *testing.T) {
	steps := 600
	if testing.Short() {
		steps = 150
	}
	// Filters that read the why column, which moves with the clock (prepared past the age
	// limit, for so long) and with the head of the line (blocked behind it).
	filters := []string{"", "prepared [0-9]+\\.[05]s|decoding [0-9]/", "behind [a-z]+[0-9]*[02468]$"}
	for _, sc := range sim.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			m, _ := feedModel(t, nil, Options{Name: sc.Name}, 200, 60)
			m.Update(keyMsg("z")) // the requests zoomed, the page map beside them
			checked, rowsSeen := 0, 0
			_, err := lockstep.Run(sc.Name, 1, steps, 50*time.Millisecond, nil, func(e *engine.Engine, evs []engine.Event) {
				if t.Failed() {
					return
				}
				if m.live.view == nil {
					s := e.Snapshot()
					m.Update(updateMsg{feed.Update{Snapshot: &s}})
					return
				}
				m.Update(updateMsg{feed.Update{Events: evs}})
				if _, ok := evs[len(evs)-1].(engine.StepCompleted); !ok {
					return
				}
				// Now and then another sort, the other way, another filter: the kept rows
				// are sorted and filtered again, and go on from there.
				n := e.StepNumber()
				if n%37 == 0 {
					m.requests = m.requests.cycleSort()
				}
				if n%53 == 0 {
					m.requests.reverse = !m.requests.reverse
				}
				if n%41 == 0 {
					f, _ := parseFilter(filters[(n/41)%uint64(len(filters))])
					m.requests = m.requests.setFilter(f)
				}
				m.refresh()
				if err := sameRows(m); err != nil {
					t.Fatalf("step %d, sort %s, filter %q: %v", n, m.requests.sortName(), m.requests.filter.text, err)
				}
				if err := sameCells(m); err != nil {
					t.Fatalf("step %d: %v", n, err)
				}
				checked++
				rowsSeen += len(m.requests.rows)
			})
			if err != nil {
				t.Fatal(err)
			}
			if checked < steps/2 || rowsSeen == 0 {
				t.Fatalf("%d steps checked, %d rows seen", checked, rowsSeen)
			}
		})
	}
}

// sameRows compares the model's requests panel with one made from scratch on its world.
func sameRows(m *Model) error {
	p := m.requests
	fresh := requestsPanel{sort: p.sort, reverse: p.reverse, filter: p.filter}.
		with(m.drawn(), m.st, m.styleGen).SetSize(p.width, p.height).Refresh()
	if len(p.rows) != len(fresh.rows) || len(p.all) != len(fresh.all) {
		return fmt.Errorf("%d of %d rows listed, from scratch %d of %d", len(p.rows), len(p.all), len(fresh.rows), len(fresh.all))
	}
	for i := range p.rows {
		a, b := *p.row(i), *fresh.row(i)
		a.ver, b.ver = 0, 0
		if a != b {
			return fmt.Errorf("row %d is %s %+v, from scratch %s %+v", i, a.r.ID, a, b.r.ID, b)
		}
	}
	if p.stuck != fresh.stuck || p.hazards != fresh.hazards {
		return fmt.Errorf("%d stuck and %d with hazards listed, from scratch %d and %d", p.stuck, p.hazards, fresh.stuck, fresh.hazards)
	}
	if p.out != fresh.out {
		return fmt.Errorf("the table drawn differs from the one drawn from scratch")
	}
	return nil
}

// sameCells compares the model's page map panel with one made from scratch on its world.
func sameCells(m *Model) error {
	p := m.pagemap
	fresh := pagesPanel{cursor: p.cursor}.with(m.drawn(), m.st, m.styleGen, p.sel).SetSize(p.width, p.height).Refresh()
	if !slices.Equal(p.cellState, fresh.cellState) || !slices.Equal(p.cellCount, fresh.cellCount) {
		return fmt.Errorf("the cells kept differ from the cells counted from scratch")
	}
	if !slices.Equal(p.marked, fresh.marked) || p.out != fresh.out {
		return fmt.Errorf("the page map drawn differs from the one drawn from scratch")
	}
	return nil
}
