package ui

import "testing"

// TestIdleStepsKeepPages checks that step summaries alone (an idle engine's) leave the page
// map as it was, so the page map is not drawn again, and that a KV write does not.
func TestIdleStepsKeepPages(t *testing.T) {
	s := watermark(t)
	m, _ := feedModel(t, s, Options{}, 120, 40)
	m.live.pages()
	built, drawn := m.live.view.PagesVersion(), m.live.pageVer
	mark := s.mark()
	s.step(3) // nothing to do: the head stays blocked
	m.Update(updateMsg{s.delta(mark)})
	if m.live.view.PagesVersion() != built || m.live.pageVer != drawn {
		t.Errorf("idle steps moved the page map: %v", s.events[mark:])
	}
	mark = s.mark()
	s.receive("r-00", 1, 2)
	m.Update(updateMsg{s.delta(mark)})
	if pd := m.live.pages(); m.live.pageVer == drawn || pd.Count[pgPartial] == 0 {
		t.Errorf("a KV write did not move the page map (%d partly received)", pd.Count[pgPartial])
	}
}
