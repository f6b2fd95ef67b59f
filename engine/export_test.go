package engine

import "fmt"

// CheckKept compares what the view keeps derived, page by page and request by request, with
// a derivation of the same view from scratch.
func (v *View) CheckKept() error {
	pm := v.PageMap()
	if err := v.checkPages(); err != nil {
		return err
	}
	sts := v.Statuses()
	var t tally
	want := statuses(v.cfg, v.stamp.At, v.facts(), pm, nil, &t)
	for i := range want {
		if sts[i] != want[i] {
			return fmt.Errorf("%s: kept status %+v, from scratch %+v", v.order[i].ID, sts[i], want[i])
		}
	}
	if got, want := v.Derived(), t.done(viewSource{v}, pm); got != want {
		return fmt.Errorf("kept counts %+v, from scratch %+v", got, want)
	}
	return nil
}

// ScratchPageMap is the engine's page map, derived from scratch.
func ScratchPageMap(e *Engine) *PageMap {
	var pm PageMap
	pm.build(engineSource{e}, engineSource{e}.facts(nil))
	return &pm
}

// ScratchStatuses are the engine's requests' statuses, derived from scratch.
func ScratchStatuses(e *Engine) []RequestStatus {
	fs := engineSource{e}.facts(nil)
	return statuses(e.cfg, e.stamp.At, fs, ScratchPageMap(e), nil, &tally{})
}

// SetKeepLimit replaces keepLimit until the returned function restores it.
func SetKeepLimit(f func(pages int) int) (restore func()) {
	was := keepLimit
	keepLimit = f
	return func() { keepLimit = was }
}

// KeepsPages says whether the view keeps its page map current now.
func (v *View) KeepsPages() bool { return v.pm.kept }
