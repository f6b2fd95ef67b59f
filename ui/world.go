package ui

import (
	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/engine/prefix"
)

// world is what the panels draw: one engine.View (the live one, or a frozen copy while the
// dashboard is paused) and its event log. What the state means (page states, request
// conditions, counts) is derived by the View itself, the same way the engine and /metrics
// derive it, once per change of the data.
type world struct {
	view *engine.View
	// ver changes whenever anything drawn from the world changes; prefixVer only when the
	// prefix tree or the last match does; pageVer only when the View's page map may have
	// (its PagesVersion moved, or a new View came): a steady trickle of step summaries (an
	// idle engine steps four times a second) does not redraw 65,536 pages. They come from
	// the dashboard's one clock, so that a View replaced by a snapshot cannot repeat a
	// version.
	ver       uint64
	prefixVer uint64
	pageVer   uint64
	// viewPages is the View's PagesVersion when pageVer last moved.
	viewPages uint64
	events    *eventLog
}

// pageState is what a page of the KV cache is doing (engine.PageState), with the UI's
// names for the states.
type pageState = engine.PageState

// The page states, from idle to alarming (but pgUnknown, a shadow's, last): a group of pages
// drawn as one cell shows its most alarming state (alarming), and the legend follows the
// order.
const (
	pgFree        = engine.PageFree
	pgActive      = engine.PageActive
	pgShared      = engine.PageShared
	pgRecycling   = engine.PageRecycling
	pgPrepared    = engine.PagePrepared
	pgAwaiting    = engine.PageAwaiting
	pgPartial     = engine.PagePartial
	pgLeaked      = engine.PageLeaked
	pgUnknown     = engine.PageUnknown
	numPageStates = engine.NumPageStates
)

var pageStateNames = [numPageStates]string{"free", "active", "shared prefix", "recycling", "KV in", "awaiting KV", "partly received", "leaked", "unknown use"}

// alarming are the states a cell of several pages shows when one of its pages has it, the
// most alarming first; a cell with none shows its most common state. A shadow's page of
// unknown use shows over free ones, under anything a request is waiting on.
var alarming = [...]pageState{pgLeaked, pgPartial, pgAwaiting, pgUnknown}

// legendStates are the states the page map's legend lists: a tap's shadow's pages of
// unknown use only for a shadow.
func (w *world) legendStates() []pageState {
	if w != nil && w.view != nil && w.view.Shadow() {
		return shadowLegend
	}
	return legend
}

// The legends: every state, and every one but pgUnknown.
var shadowLegend, legend = func() (all, some []pageState) {
	for s := range numPageStates {
		all = append(all, s)
		if s != pgUnknown {
			some = append(some, s)
		}
	}
	return all, some
}()

// pages returns the View's page map.
func (w *world) pages() *engine.PageMap { return w.view.PageMap() }

// ownerOf returns the request that holds a sequence, when it still does.
func ownerOf(v *engine.View, seq int64) (*engine.RequestView, bool) {
	id, ok := v.Owner(seq)
	if !ok {
		return nil, false
	}
	return v.Request(id)
}

// seqState says whether the prefix cache holds a sequence as active or recycling.
func seqState(v *engine.View, seq int64) (prefix.State, bool) {
	for _, s := range v.Recycling() {
		if s == seq {
			return prefix.Recycling, true
		}
	}
	if v.Cache().HasSequence(seq) {
		return prefix.Active, true
	}
	return 0, false
}
