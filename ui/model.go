package ui

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
	"github.com/dustin/go-humanize"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// panelID names a panel; the number keys 1…7 select them in this order.
type panelID int

const (
	panelRequests panelID = iota
	panelPages
	panelPrefix
	panelSegments
	panelEvents
	panelDetail
	panelCharts
	numPanels
)

var panelNames = [numPanels]string{"requests", "pages", "prefix", "segments", "events", "detail", "charts"}

// Messages.
type (
	// updateMsg carries everything the source had pending.
	updateMsg struct{ u feed.Update }
	// sourceDoneMsg says the source has ended, with what it still had.
	sourceDoneMsg struct{ u feed.Update }
	// frameMsg says a frame interval has passed since the last update was folded: time to
	// take what is pending.
	frameMsg struct{}
	// linkTickMsg asks for the link's state again (a link can go down with no update).
	linkTickMsg struct{}
	// controlDoneMsg is the source's answer to a control.
	controlDoneMsg struct {
		c   feed.Control
		err error
	}
)

// defaultFPS is Options.FPS's default.
const defaultFPS = 25

// linkPoll is how often the link's state is read.
const linkPoll = time.Second

// Model is the dashboard: the root Bubble Tea model. It folds the source's updates into an
// engine.View, and draws it through its panels. Build it with New; run it with Run, or in
// a tea.Program of your own.
type Model struct {
	src  Source
	opts Options
	keys KeyMap

	st       *Styles
	styleGen int
	plain    bool
	isDark   bool

	clock  uint64 // versions of every world come from this one counter
	live   *world
	frozen *world // set while paused: what is drawn

	// hist is what the dashboard received, bounded, to rewind through; series the history
	// charts' samples, one a step; rw the rewound view, while there is one (rewind.go).
	hist   *feed.History
	series *series
	rw     *rewound
	rec    *recording // R: a recording under way
	epoch  uint64     // of the history: the source's connection it came over (feed.Update.Epoch)

	status     feed.Status
	haveStatus bool
	link       feed.Link
	dropped    uint64
	diverged   error // the view broke; a resync was asked
	behind     uint64
	refreeze   bool // a single step was asked while frozen
	closed     bool

	width, height int
	active        panelID
	back          panelID // where esc goes from the detail
	focus         panelID // the overview's panel last focused
	zoomed        bool    // the overview's focused panel is shown alone
	showHelp      bool
	filterInput   textinput.Model // focused while the filter is typed
	seekInput     textinput.Model // focused while a step to go to is typed (replay)
	message       string
	messageErr    bool

	requests requestsPanel
	pagemap  pagesPanel
	prefix   prefixPanel
	segments segmentsPanel
	events   eventsPanel
	detail   detailPanel
	charts   chartsPanel
	help     help.Model

	boxes      [numPanels]boxCache
	header     string
	headerKey  headerKey
	parts      frameParts
	chromeKey  chromeKey
	tabsText   string
	footerText string
	frame      string
	frames     uint64 // frames built, for tests
}

// New returns a dashboard reading from src.
func New(src Source, opts Options) *Model {
	if opts.FPS <= 0 {
		opts.FPS = defaultFPS
	}
	if opts.EventLog <= 0 {
		opts.EventLog = defaultLogSize
	}
	m := &Model{
		src:    src,
		opts:   opts,
		keys:   DefaultKeyMap(),
		isDark: !opts.Light,
		plain:  opts.NoColor || (opts.Profile != colorprofile.Unknown && opts.Profile <= colorprofile.ASCII),
		width:  80,
		height: 24,
		help:   help.New(),
		link:   src.Link(),

		filterInput: newPrompt("/", 0),
		seekInput:   newPrompt("go to step: ", seekLimit),
	}
	if opts.History == (feed.HistoryLimits{}) {
		opts.History = feed.DefaultHistoryLimits
	}
	m.opts = opts
	m.live = &world{events: newEventLog(opts.EventLog)}
	m.hist = feed.NewHistory(opts.History)
	m.series = newSeries(seriesCap(opts.History))
	m.setStyles()
	m.refresh()
	return m
}

// Init starts waiting on the source, polling the link and asking the terminal's colours.
func (m *Model) Init() tea.Cmd {
	return tea.Batch(m.wait(), linkTick(), tea.RequestBackgroundColor)
}

// wait is the one re-armed command: it waits on the source and returns everything pending
// as one message.
func (m *Model) wait() tea.Cmd {
	src := m.src
	return func() tea.Msg {
		if _, ok := <-src.C(); !ok {
			return sourceDoneMsg{src.Take()}
		}
		return updateMsg{src.Take()}
	}
}

func linkTick() tea.Cmd {
	return tea.Tick(linkPoll, func(time.Time) tea.Msg { return linkTickMsg{} })
}

func (m *Model) control(c feed.Control) tea.Cmd {
	src := m.src
	return func() tea.Msg { return controlDoneMsg{c, src.Control(c)} }
}

// Update folds updates and handles keys.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	var cmd tea.Cmd
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tea.BackgroundColorMsg:
		if m.isDark != msg.IsDark() {
			m.isDark = msg.IsDark()
			m.setStyles()
		}
	case tea.ColorProfileMsg:
		if plain := m.opts.NoColor || msg.Profile <= colorprofile.ASCII; plain != m.plain {
			m.plain = plain
			m.setStyles()
		}
	case updateMsg:
		cmd = tea.Batch(m.fold(msg.u), tea.Tick(time.Second/time.Duration(m.opts.FPS), func(time.Time) tea.Msg { return frameMsg{} }))
	case frameMsg:
		cmd = m.wait()
	case sourceDoneMsg:
		cmd = m.fold(msg.u)
		m.closed = true
	case linkTickMsg:
		m.link = m.src.Link()
		cmd = linkTick()
	case seekMsg:
		m.rewindTo(msg.step)
	case recordDoneMsg:
		m.recorded(msg)
	case controlDoneMsg:
		if msg.err != nil {
			m.setMessage(fmt.Sprintf("%s refused: %v", msg.c.Op, msg.err), true)
		}
	case tea.KeyPressMsg:
		cmd = m.onKey(msg)
	case tea.PasteMsg:
		cmd = m.onPaste(msg)
	case tea.MouseClickMsg:
		cmd = m.onClick(msg)
	case tea.MouseWheelMsg:
		cmd = m.onWheel(msg)
	}
	m.refresh()
	return m, cmd
}

// View returns the frame built by the last Update.
func (m *Model) View() tea.View {
	v := tea.NewView(m.frame)
	v.AltScreen = true
	v.WindowTitle = "kvtop " + m.name()
	if m.opts.Mouse {
		v.MouseMode = tea.MouseModeCellMotion
	}
	return v
}

func (m *Model) name() string {
	if m.opts.Name != "" {
		return m.opts.Name
	}
	if m.link.Name != "" {
		return m.link.Name
	}
	return "engine"
}

// controllable says whether pause and step may reach the engine.
func (m *Model) controllable() bool {
	return m.opts.Control && (!m.haveStatus || m.status.Controllable)
}

// drawn returns the world the panels draw: the rewound one while rewound, the frozen one
// while paused.
func (m *Model) drawn() *world {
	if m.rw != nil {
		return m.rw.w
	}
	if m.frozen != nil {
		return m.frozen
	}
	return m.live
}

func (m *Model) touch(w *world) {
	m.clock++
	w.ver = m.clock
}

// fold applies an update to the live world, and keeps it in the rewind history and the
// charts' series. An event that does not fit the view means the view missed something: it
// stops applying events (and keeping them) and asks the source for a snapshot.
func (m *Model) fold(u feed.Update) tea.Cmd {
	if m.opts.OnUpdate != nil {
		m.opts.OnUpdate(u)
	}
	var cmd tea.Cmd
	if u.Status != nil {
		m.status, m.haveStatus = *u.Status, true
	}
	w := m.live
	if u.Dropped > m.dropped {
		w.events.note(m.liveStep(), fmt.Sprintf("%s events lost: the dashboard fell behind its source, which sends a snapshot instead",
			humanize.Comma(int64(u.Dropped-m.dropped))), true)
		m.dropped = u.Dropped
	}
	changed := false
	if u.Snapshot != nil {
		v, err := engine.NewView(*u.Snapshot)
		if err != nil {
			m.diverged = err
			w.events.note(u.Snapshot.Stamp.Step, "a snapshot that does not load: "+err.Error()+"; another was asked for", true)
			cmd = m.control(feed.Control{Op: feed.ControlSnapshot})
		} else {
			if w.view != nil {
				w.events.note(u.Snapshot.Stamp.Step, fmt.Sprintf("a fresh snapshot: the view starts over at step %s", humanize.Comma(int64(u.Snapshot.Stamp.Step))), false)
			}
			w.view, m.diverged = v, nil
			m.clock++
			w.prefixVer, w.pageVer, w.viewPages = m.clock, m.clock, v.PagesVersion()
			if _, last, ok := m.hist.Steps(); ok && (u.Epoch != m.epoch || u.Snapshot.Stamp.Step < last) {
				// A new connection (perhaps to a restarted server), or steps that went
				// back: perhaps another run of the engine, whose past is not this one's.
				m.hist.Reset()
				m.series.reset()
				m.rw = nil
			}
			m.epoch = u.Epoch
			m.hist.AddSnapshot(u.Snapshot)
		}
		changed = true
	}
	stepped := false
	kept := 0 // the events that applied, in order, from the first: those the history keeps
	for i, ev := range u.Events {
		w.events.push(ev)
		switch ev.(type) {
		case engine.PrefixMatched, engine.PrefixChanged:
			m.clock++
			w.prefixVer = m.clock
		case engine.StepCompleted:
			stepped = true
		}
		if w.view == nil || m.diverged != nil {
			continue
		}
		if err := w.view.Apply(ev); err != nil {
			m.diverged = err
			w.events.note(ev.When().Step, "the view diverged: "+err.Error()+"; a fresh snapshot was asked for", true)
			cmd = m.control(feed.Control{Op: feed.ControlSnapshot})
			continue
		}
		kept = i + 1
		if sc, ok := ev.(engine.StepCompleted); ok {
			m.series.push(w.view, sc)
		}
	}
	m.hist.AddEvents(u.Events[:kept])
	if m.rec != nil {
		// What the history keeps: a recording of it replays.
		r := u
		r.Events = u.Events[:kept]
		m.rec.push(r)
	}
	if m.hist.Due() && m.diverged == nil {
		s := w.view.Snapshot()
		m.hist.AddSnapshot(&s)
	}
	if w.view != nil && w.view.PagesVersion() != w.viewPages {
		m.clock++
		w.pageVer, w.viewPages = m.clock, w.view.PagesVersion()
	}
	if len(u.Events) > 0 {
		changed = true
	}
	if changed {
		m.touch(w)
		if m.frozen != nil {
			m.behind += uint64(len(u.Events))
			if m.refreeze && stepped {
				m.refreeze = false
				m.freeze()
			}
		}
	}
	return cmd
}

// freeze copies the live world for drawing while paused: the View deeply (its requests
// change in place as events apply), and the event log.
func (m *Model) freeze() {
	f := &world{events: m.live.events.clone()}
	if m.live.view != nil {
		if v, err := engine.NewView(m.live.view.Snapshot()); err == nil {
			f.view, f.viewPages = v, v.PagesVersion()
		} else {
			m.setMessage("cannot freeze the view: "+err.Error(), true)
		}
	}
	m.touch(f)
	f.prefixVer, f.pageVer = f.ver, f.ver
	m.frozen = f
	m.behind = 0
}

func (m *Model) setMessage(s string, isErr bool) {
	m.message, m.messageErr = s, isErr
}

func (m *Model) setStyles() {
	var s Styles
	if m.plain {
		s = PlainStyles()
	} else {
		s = DefaultStyles(m.isDark)
	}
	m.st = &s
	m.styleGen++
	m.help.Styles = s.Help
	m.filterInput.SetStyles(s.Prompt)
	m.seekInput.SetStyles(s.Prompt)
}

// onKey handles a key press: an open prompt and the help overlay take keys first, then
// the global bindings, then the active panel.
func (m *Model) onKey(k tea.KeyPressMsg) tea.Cmd {
	if key.Matches(k, m.keys.ForceQuit) {
		return tea.Quit
	}
	if m.filterInput.Focused() {
		return m.filterKey(k)
	}
	if m.seekInput.Focused() {
		return m.seekKey(k)
	}
	if m.showHelp {
		switch {
		case key.Matches(k, m.keys.Quit):
			return tea.Quit
		case key.Matches(k, m.keys.Help, m.keys.Back):
			m.showHelp = false
		}
		return nil
	}
	m.message = ""
	switch {
	case key.Matches(k, m.keys.Quit):
		return tea.Quit
	case key.Matches(k, m.keys.Help):
		m.showHelp = true
	case key.Matches(k, m.keys.NextPanel):
		m.cycle(1)
	case key.Matches(k, m.keys.PrevPanel):
		m.cycle(-1)
	case key.Matches(k, m.keys.Zoom):
		m.zoom()
	case key.Matches(k, m.keys.StepBack):
		m.rewindBy(-1)
	case key.Matches(k, m.keys.StepForward):
		m.rewindBy(1)
	case key.Matches(k, m.keys.JumpBack):
		m.rewindBy(-rewindStep)
	case key.Matches(k, m.keys.JumpForward):
		m.rewindBy(rewindStep)
	case key.Matches(k, m.keys.Record):
		return m.toggleRecording()
	case key.Matches(k, m.keys.Live):
		if m.rw == nil {
			m.setMessage("the view is live already", false)
		}
		m.goLive()
	case key.Matches(k, m.keys.Panel[:]...):
		for i, b := range m.keys.Panel {
			if key.Matches(k, b) {
				m.setActive(panelID(i))
			}
		}
	case key.Matches(k, m.keys.Filter):
		switch m.active {
		case panelRequests:
			return openPrompt(&m.filterInput, m.requests.filter.text)
		case panelEvents:
			return openPrompt(&m.filterInput, m.events.filter.text)
		default:
			m.setMessage("filter works in the requests and events panels", false)
		}
	case key.Matches(k, m.keys.Sort):
		if m.active != panelRequests {
			m.setMessage("sort works in the requests panel", false)
			break
		}
		m.requests = m.requests.cycleSort()
		m.setMessage("sorted by "+m.requests.sortName(), false)
	case key.Matches(k, m.keys.Reverse):
		if m.active == panelRequests {
			m.requests.reverse = !m.requests.reverse
			m.setMessage("sorted by "+m.requests.sortName(), false)
		}
	case key.Matches(k, m.keys.Pause):
		return m.togglePause()
	case key.Matches(k, m.keys.Step):
		return m.step()
	case key.Matches(k, m.keys.Resync):
		m.setMessage("resync: a fresh snapshot was asked for", false)
		return m.control(feed.Control{Op: feed.ControlSnapshot})
	case key.Matches(k, m.keys.Faster, m.keys.Slower):
		speed := m.status.Target
		if speed <= 0 {
			speed = 1
		}
		if key.Matches(k, m.keys.Faster) {
			speed *= 2
		} else {
			speed /= 2
		}
		pct := min(max(int(speed*100+0.5), 1), 100_000)
		m.setMessage(fmt.Sprintf("speed ×%g", float64(pct)/100), false)
		return m.control(feed.Control{Op: feed.ControlSpeed, N: pct})
	case key.Matches(k, m.keys.Seek):
		return openPrompt(&m.seekInput, "")
	case key.Matches(k, m.keys.Back):
		switch {
		case m.active == panelDetail:
			m.setActive(m.back)
		case m.fitsOverview() && !inOverview(m.active):
			m.setActive(m.focus)
		case m.active == panelRequests && m.requests.filter.text != "":
			m.requests = m.requests.setFilter(filterSpec{})
		case m.active == panelEvents && m.events.filter.text != "":
			m.events = m.events.setFilter(filterSpec{})
		case m.opts.Back != nil:
			return m.opts.Back
		}
	case key.Matches(k, m.keys.Enter):
		return m.enter(k)
	default:
		return m.toPanel(k)
	}
	return nil
}

// enter opens the detail of the request under the cursor of the active panel (the prefix
// tree folds its node instead).
func (m *Model) enter(k tea.KeyPressMsg) tea.Cmd {
	var id string
	switch m.active {
	case panelRequests:
		id = m.requests.selected()
	case panelPages:
		id = m.pagemap.ownerAtCursor()
	case panelSegments:
		id = m.segments.selected()
	case panelEvents:
		id = m.events.selected()
	default:
		return m.toPanel(k)
	}
	if id == "" {
		m.setMessage("no request here", false)
		return nil
	}
	m.requests = m.requests.selectID(id)
	m.setActive(panelDetail)
	m.detail = m.detail.open(id)
	return nil
}

func (m *Model) setActive(p panelID) {
	if p == panelDetail && m.active != panelDetail {
		m.back = m.active
		m.detail = m.detail.open(m.requests.selected())
	}
	if inOverview(m.active) {
		m.focus = m.active
	}
	m.active = p
}

// cycle moves the focus d panels on: through the overview's boxes when it is shown, through
// every panel otherwise.
func (m *Model) cycle(d int) {
	if !m.overview() {
		m.setActive(panelID((int(m.active) + d + int(numPanels)) % int(numPanels)))
		return
	}
	for i, p := range overviewPanels {
		if p == m.active {
			n := len(overviewPanels)
			m.setActive(overviewPanels[(i+d+n)%n])
			return
		}
	}
}

// zoom shows the overview's focused panel alone, or the overview again.
func (m *Model) zoom() {
	switch {
	case !m.fitsOverview():
		m.setMessage(fmt.Sprintf("the overview needs %d×%d; this terminal is %d×%d", overviewWidth, overviewHeight, m.width, m.height), false)
	case m.zoomed:
		m.zoomed = false
		if !inOverview(m.active) {
			m.setActive(m.focus)
		}
	case !inOverview(m.active):
		m.setActive(m.focus) // a panel the overview has no box for: back to the overview
	default:
		m.zoomed = true
	}
}

// toPanel hands a key to the active panel.
func (m *Model) toPanel(k tea.Msg) tea.Cmd {
	var cmd tea.Cmd
	switch m.active {
	case panelRequests:
		m.requests, cmd = m.requests.Update(k)
	case panelPages:
		m.pagemap, cmd = m.pagemap.Update(k)
	case panelPrefix:
		m.prefix, cmd = m.prefix.Update(k)
	case panelSegments:
		m.segments, cmd = m.segments.Update(k)
	case panelEvents:
		m.events, cmd = m.events.Update(k)
	case panelDetail:
		m.detail, cmd = m.detail.Update(k)
	case panelCharts:
		m.charts, cmd = m.charts.Update(k)
	}
	return cmd
}

// seekKey edits the step to go to (digits only); enter asks the source to seek there.
func (m *Model) seekKey(k tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(k, m.keys.CancelPrompt):
		closePrompt(&m.seekInput)
	case key.Matches(k, m.keys.AcceptPrompt):
		s := m.seekInput.Value()
		closePrompt(&m.seekInput)
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			m.setMessage(fmt.Sprintf("go to step: %q is not a step number", s), true)
			return nil
		}
		// A step the rewind history holds is shown from it; another one is asked of the
		// source (a recording played back seeks there; a live engine says it cannot).
		if first, _, ok := m.hist.Steps(); ok && uint64(n) >= first && uint64(n) <= m.liveStep() {
			m.rewindTo(uint64(n))
			return nil
		}
		m.setMessage(fmt.Sprintf("going to step %d", n), false)
		return m.control(feed.Control{Op: feed.ControlSeek, N: n})
	case k.Text != "" && digits(k.Text) != k.Text:
		// Not a step number: dropped, as the prompt says digits only.
	default:
		var cmd tea.Cmd
		m.seekInput, cmd = m.seekInput.Update(k)
		return cmd
	}
	return nil
}

// filterKey edits the filter; it applies as it is typed.
func (m *Model) filterKey(k tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(k, m.keys.AcceptPrompt):
		m.filterInput.Blur()
		return nil
	case key.Matches(k, m.keys.CancelPrompt):
		closePrompt(&m.filterInput)
		m.applyFilter("")
		return nil
	}
	return m.editFilter(k)
}

// editFilter hands a key or a paste to the filter prompt, and applies what it holds if
// that changed.
func (m *Model) editFilter(msg tea.Msg) tea.Cmd {
	was := m.filterInput.Value()
	var cmd tea.Cmd
	m.filterInput, cmd = m.filterInput.Update(msg)
	if v := m.filterInput.Value(); v != was {
		m.applyFilter(v)
	}
	return cmd
}

// onPaste hands a terminal's paste to the open prompt.
func (m *Model) onPaste(p tea.PasteMsg) tea.Cmd {
	var cmd tea.Cmd
	switch {
	case m.filterInput.Focused():
		cmd = m.editFilter(p)
	case m.seekInput.Focused():
		m.seekInput, cmd = m.seekInput.Update(tea.PasteMsg{Content: digits(p.Content)})
	}
	return cmd
}

// applyFilter filters the active panel by text; a bad expression keeps the last good
// filter and says why.
func (m *Model) applyFilter(text string) {
	f, err := parseFilter(text)
	if err != nil {
		m.setMessage("bad filter: "+err.Error(), true)
		return
	}
	m.message = ""
	switch m.active {
	case panelRequests:
		m.requests = m.requests.setFilter(f)
	case panelEvents:
		m.events = m.events.setFilter(f)
	}
}

// togglePause freezes or thaws the view; with control of the engine it pauses or resumes
// the engine too. While frozen the source is still read (nothing backs up): what arrives
// is folded into the live view and counted, not drawn.
func (m *Model) togglePause() tea.Cmd {
	ctl := m.controllable()
	if m.frozen == nil && ctl && m.haveStatus && m.status.Paused {
		// The engine is paused already (started paused, or paused by another dashboard):
		// p resumes it rather than pausing twice.
		m.setMessage("resumed", false)
		return m.control(feed.Control{Op: feed.ControlResume})
	}
	if m.frozen == nil {
		m.freeze()
		if ctl {
			m.setMessage("paused: engine paused, view frozen", false)
			return m.control(feed.Control{Op: feed.ControlPause})
		}
		m.setMessage("paused: view frozen (the engine runs on: read-only)", false)
		return nil
	}
	m.frozen = nil
	m.refreeze = false
	m.setMessage("resumed", false)
	if ctl {
		return m.control(feed.Control{Op: feed.ControlResume})
	}
	return nil
}

// step asks the engine for one step; the frozen view follows when the step arrives.
func (m *Model) step() tea.Cmd {
	if !m.controllable() {
		m.setMessage("single step refused: this dashboard is read-only (embedded, or attach to a --control server)", true)
		return nil
	}
	if m.frozen != nil {
		m.refreeze = true
	}
	m.setMessage("step", false)
	return m.control(feed.Control{Op: feed.ControlStep, N: 1})
}

// refresh hands the drawn world to the visible panels, lets them render what changed, and
// composes the frame. Everything View returns is built here.
func (m *Model) refresh() {
	w := m.drawn()
	if m.overview() {
		for _, b := range m.overviewBoxes() {
			in := b.r.inner()
			m.refreshPanel(b.id, w, in.w, in.h)
		}
	} else {
		_, bh := m.bodySize()
		mainW, sideW := m.split()
		m.refreshPanel(m.active, w, mainW, bh)
		if sideW > 0 {
			m.refreshPanel(panelPages, w, sideW, bh)
		}
	}
	m.refreshHeader(w)
	m.compose()
}

// refreshPanel hands a panel the world and its size, and lets it render what changed. The
// page map marks the selected request's pages: the requests panel, when shown, refreshes
// first.
func (m *Model) refreshPanel(id panelID, w *world, width, height int) {
	sel := m.requests.selected()
	if m.active == panelDetail {
		sel = m.detail.id
	}
	switch id {
	case panelRequests:
		m.requests = m.requests.with(w, m.st, m.styleGen).SetSize(width, height).Refresh()
	case panelPages:
		m.pagemap = m.pagemap.with(w, m.st, m.styleGen, sel).SetSize(width, height).Refresh()
	case panelPrefix:
		m.prefix = m.prefix.with(w, m.st, m.styleGen).SetSize(width, height).Refresh()
	case panelSegments:
		m.segments = m.segments.with(w, m.st, m.styleGen).SetSize(width, height).Refresh()
	case panelEvents:
		m.events = m.events.with(w, m.st, m.styleGen).SetSize(width, height).Refresh()
	case panelDetail:
		m.detail = m.detail.with(w, m.st, m.styleGen).SetSize(width, height).Refresh()
	case panelCharts:
		mark := int64(-1)
		if m.rw != nil {
			mark = int64(m.rw.step)
		}
		m.charts = m.charts.with(m.series, m.st, m.styleGen, mark, heldFrom(m.hist)).SetSize(width, height).Refresh()
	}
}

// panelView returns a panel's rendered text.
func (m *Model) panelView(id panelID) string {
	switch id {
	case panelRequests:
		return m.requests.View()
	case panelPages:
		return m.pagemap.View()
	case panelPrefix:
		return m.prefix.View()
	case panelSegments:
		return m.segments.View()
	case panelEvents:
		return m.events.View()
	case panelDetail:
		return m.detail.View()
	case panelCharts:
		return m.charts.View()
	}
	return ""
}

// frameParts are what a frame is made of; a frame is rebuilt only when one changes.
type frameParts struct {
	header, banner, tabs, footer string
	views                        [len(overviewPanels)]string // the overview's, or the main panel and the page map beside it
	overview                     bool
	active                       panelID
	width, height, mainW         int
}

func (m *Model) compose() {
	var fp frameParts
	fp.header = m.header
	if m.diverged != nil {
		fp.banner = fit(m.st.Error.Render("VIEW DIVERGED: "+m.diverged.Error()+" (a fresh snapshot was asked for)"), m.width)
	}
	fp.tabs, fp.footer = m.chrome()
	_, bh := m.bodySize()
	mainW, sideW := m.split()
	var boxes []box
	switch {
	case m.showHelp:
		fp.views[0] = m.helpView()
	case m.overview():
		fp.overview = true
		boxes = m.overviewBoxes()
		for i, b := range boxes {
			fp.views[i] = m.panelView(b.id)
		}
	default:
		fp.views[0] = m.panelView(m.active)
		if sideW > 0 {
			fp.views[1] = m.pagemap.View()
		}
	}
	fp.active = m.active
	fp.width, fp.height, fp.mainW = m.width, m.height, mainW
	if fp == m.parts && m.frame != "" {
		return
	}
	m.parts = fp
	var b strings.Builder
	b.Grow(len(fp.header) + m.width*m.height*4)
	b.WriteString(fp.header)
	b.WriteByte('\n')
	if fp.banner != "" {
		b.WriteString(fp.banner)
		b.WriteByte('\n')
	}
	b.WriteString(fp.tabs)
	b.WriteByte('\n')
	if fp.overview {
		m.composeOverview(&b, boxes, fp.views[:len(boxes)])
	} else {
		body := fp.views[0]
		if sideW > 0 {
			body = besides(body, mainW, m.st.Dim.Render("│"), fp.views[1], bh)
		}
		writeBlock(&b, body, bh)
	}
	b.WriteString(fp.footer)
	m.frame = b.String()
	m.frames++
}

// writeBlock writes exactly h lines of s (cut or padded), each followed by a newline.
func writeBlock(b *strings.Builder, s string, h int) {
	n := 0
	for line := range strings.SplitSeq(s, "\n") {
		if n == h {
			break
		}
		b.WriteString(line)
		b.WriteByte('\n')
		n++
	}
	for ; n < h; n++ {
		b.WriteByte('\n')
	}
}

// besides puts two blocks side by side, the left one padded to lw columns.
func besides(left string, lw int, sep, right string, h int) string {
	ls := strings.Split(left, "\n")
	rs := strings.Split(right, "\n")
	var b strings.Builder
	for i := range h {
		var l, r string
		if i < len(ls) {
			l = ls[i]
		}
		if i < len(rs) {
			r = rs[i]
		}
		b.WriteString(l)
		if pad := lw - width(l); pad > 0 {
			b.WriteString(strings.Repeat(" ", pad))
		}
		b.WriteString(sep)
		b.WriteString(r)
		if i < h-1 {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// chromeKey is what the tab bar and the footer depend on.
type chromeKey struct {
	active          panelID
	showHelp        bool
	overview, fits  bool
	width, styleGen int
	filtering       bool
	seeking         bool
	input           string // the open prompt's value
	cursor          int    // and its cursor
	message         string
	messageErr      bool
}

// chrome returns the tab bar and the footer, built again only when they change.
func (m *Model) chrome() (string, string) {
	k := chromeKey{active: m.active, showHelp: m.showHelp, overview: m.overview(), fits: m.fitsOverview(), width: m.width, styleGen: m.styleGen,
		filtering: m.filterInput.Focused(), seeking: m.seekInput.Focused(), message: m.message, messageErr: m.messageErr}
	switch {
	case k.filtering:
		k.input, k.cursor = m.filterInput.Value(), m.filterInput.Position()
	case k.seeking:
		k.input, k.cursor = m.seekInput.Value(), m.seekInput.Position()
	}
	if k != m.chromeKey || m.tabsText == "" {
		m.chromeKey = k
		m.tabsText, m.footerText = m.tabs(), m.footer()
	}
	return m.tabsText, m.footerText
}

func (m *Model) tabs() string {
	var b strings.Builder
	for i := range numPanels {
		label := fmt.Sprintf(" %d %s ", i+1, panelNames[i])
		if panelID(i) == m.active && !m.showHelp {
			b.WriteString(m.st.TabActive.Render(label))
		} else {
			b.WriteString(m.st.Tab.Render(label))
		}
	}
	switch {
	case m.overview():
		b.WriteString(m.st.Dim.Render("  overview · tab focus · z zooms"))
	case m.fitsOverview() && inOverview(m.active):
		b.WriteString(m.st.Dim.Render("  zoomed · z for the overview"))
	case m.fitsOverview():
		b.WriteString(m.st.Dim.Render("  esc for the overview"))
	}
	return fit(b.String(), m.width)
}

func (m *Model) footer() string {
	switch {
	case m.filterInput.Focused():
		return fit(m.filterInput.View()+"  enter keeps · esc clears · a leading ! inverts", m.width)
	case m.seekInput.Focused():
		return fit(m.seekInput.View()+"  enter goes · esc cancels", m.width)
	case m.message != "":
		if m.messageErr {
			return fit(m.st.Error.Render(m.message), m.width)
		}
		return fit(m.st.Footer.Render(m.message), m.width)
	}
	m.help.SetWidth(m.width)
	// help adds every item past the width when its ellipsis does not fit there either:
	// cut what it gives.
	return fit(m.help.ShortHelpView(m.keys.ShortHelp()), m.width)
}

func (m *Model) helpView() string {
	var b strings.Builder
	b.WriteString(m.st.Heading.Render("Keys"))
	b.WriteString("\n")
	h := m.help
	h.SetWidth(0)
	h.FullSeparator = "   "
	// As many groups side by side as the width takes, then the next row of them.
	groups := m.keys.FullHelp()
	var rows []string
	for i := 0; i < len(groups); {
		j := i + 1
		for j < len(groups) && lipgloss.Width(h.FullHelpView(groups[i:j+1])) <= m.width {
			j++
		}
		rows = append(rows, h.FullHelpView(groups[i:j]))
		i = j
	}
	b.WriteString(strings.Join(rows, "\n\n"))
	b.WriteString("\n\n")
	b.WriteString(m.st.Heading.Render("Page map"))
	b.WriteString(" (enter on a page opens its owner)\n")
	for s := range numPageStates {
		if s == pgAwaiting {
			b.WriteString("\n")
		}
		b.WriteString(m.st.Cell[s].Render(m.st.Glyph[s]))
		b.WriteString(" " + pageStateNames[s] + "  ")
	}
	b.WriteString("\na cell of several pages shows its most alarming state (leaked, partly received, awaiting KV, unknown use), else its most common\n\n")
	b.WriteString(m.st.Heading.Render("Request rows"))
	b.WriteString("  ! stuck (blocked, prepared past the age limit, or leaked)  * hazards\n")
	b.WriteString("Charts: " + areaGlyph + " the area, " + lineGlyph + " the line through it, the watermark dashed; the scrubber: ─ held for rewind, ┄ no longer, ◆ the step drawn\n")
	b.WriteString("Prefix tree: enter folds a node · Events: G follows the newest · esc or ? closes this help")
	lines := strings.Split(b.String(), "\n")
	for i, l := range lines {
		lines[i] = fit(l, m.width)
	}
	return strings.Join(lines, "\n")
}

// fit cuts s to w columns.
func fit(s string, w int) string {
	if width(s) <= w {
		return s
	}
	return ansi.Truncate(s, w, "…")
}
