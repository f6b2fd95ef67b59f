package ui

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
	"github.com/dustin/go-humanize"
)

// FleetRow is one decode instance as the instance picker lists it: what a tap knows of it.
type FleetRow struct {
	Address  string
	Role     string
	Note     string
	Waiting  int
	Prepared int
	Running  int
	Stuck    int
	Used     int // pages
	Free     int
	// Oldest is the age of its oldest waiting request; Head the request at the head of its
	// line and Why what keeps it waiting ("" when nothing does).
	Oldest      time.Duration
	Head, Why   string
	Divergences uint64
	Standing    string
}

// Fleet is what the picker reads: the instances of a tap, and a source for the dashboard of
// one of them. The command provides it over the tap's API.
type Fleet interface {
	// Rows lists the instances.
	Rows(ctx context.Context) ([]FleetRow, error)
	// Open returns the source of one instance's dashboard.
	Open(ctx context.Context, addr string) (Source, error)
}

// pickerSorts are the orders the fleet table cycles through (s), each with its key.
var pickerSorts = []struct {
	name string
	less func(a, b FleetRow) int
}{
	{"stuck", func(a, b FleetRow) int { return cmpDesc(a.Stuck, b.Stuck, a.Oldest, b.Oldest) }},
	{"waiting", func(a, b FleetRow) int { return cmpDesc(a.Waiting, b.Waiting, a.Oldest, b.Oldest) }},
	{"pages used", func(a, b FleetRow) int { return cmpDesc(a.Used, b.Used, 0, 0) }},
	{"divergences", func(a, b FleetRow) int { return cmpDesc(int(a.Divergences), int(b.Divergences), 0, 0) }},
	{"address", func(a, b FleetRow) int { return strings.Compare(a.Address, b.Address) }},
}

func cmpDesc(a, b int, ta, tb time.Duration) int {
	switch {
	case a != b:
		return b - a
	case ta != tb:
		if ta > tb {
			return -1
		}
		return 1
	}
	return 0
}

// Picker is the instance picker: a fleet table of a tap's decode instances, one row each;
// enter opens that instance's dashboard (a Model), esc comes back to the table.
type Picker struct {
	fleet  Fleet
	opts   Options
	keys   pickerKeys
	st     Styles
	rows   []FleetRow
	err    error
	cursor int
	sort   int
	width  int
	height int
	// inner is the open dashboard (nil: the table), gen counts the dashboards opened, so
	// that what a closed one's commands bring back is dropped.
	inner *Model
	gen   int
	addr  string
}

type pickerKeys struct {
	Up, Down, Open, Sort, Refresh, Quit key.Binding
}

func defaultPickerKeys() pickerKeys {
	return pickerKeys{
		Up:      key.NewBinding(key.WithKeys("up", "k"), key.WithHelp("↑/k", "up")),
		Down:    key.NewBinding(key.WithKeys("down", "j"), key.WithHelp("↓/j", "down")),
		Open:    key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "open")),
		Sort:    key.NewBinding(key.WithKeys("s"), key.WithHelp("s", "sort")),
		Refresh: key.NewBinding(key.WithKeys("r"), key.WithHelp("r", "refresh")),
		Quit:    key.NewBinding(key.WithKeys("q", "ctrl+c"), key.WithHelp("q", "quit")),
	}
}

// Messages of the picker.
type (
	rowsMsg struct {
		rows []FleetRow
		err  error
	}
	pickerTickMsg struct{}
	openedMsg     struct {
		addr string
		src  Source
		err  error
	}
	backMsg  struct{}
	innerMsg struct {
		gen int
		msg tea.Msg
	}
)

// pickerPoll is how often the table is read again.
const pickerPoll = time.Second

// NewPicker returns the picker over a fleet; opts are the dashboards' options.
func NewPicker(fleet Fleet, opts Options) *Picker {
	p := &Picker{fleet: fleet, opts: opts, keys: defaultPickerKeys(), st: DefaultStyles(!opts.Light), width: 80, height: 24}
	if opts.NoColor {
		p.st = PlainStyles()
	}
	return p
}

// Init reads the table.
func (p *Picker) Init() tea.Cmd { return p.fetch() }

func (p *Picker) fetch() tea.Cmd {
	f := p.fleet
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rows, err := f.Rows(ctx)
		return rowsMsg{rows, err}
	}
}

// Update handles the table's keys, or hands everything to the open dashboard.
func (p *Picker) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		p.width, p.height = msg.Width, msg.Height
	case rowsMsg:
		if msg.err == nil {
			at := ""
			if p.cursor < len(p.rows) {
				at = p.rows[p.cursor].Address
			}
			p.rows = msg.rows
			p.sortRows(at)
		}
		p.err = msg.err
		return p, tea.Tick(pickerPoll, func(time.Time) tea.Msg { return pickerTickMsg{} })
	case pickerTickMsg:
		if p.inner == nil {
			return p, p.fetch()
		}
		return p, tea.Tick(pickerPoll, func(time.Time) tea.Msg { return pickerTickMsg{} })
	case openedMsg:
		if msg.err != nil {
			p.err = fmt.Errorf("open %s: %w", msg.addr, msg.err)
			return p, nil
		}
		p.gen++
		opts := p.opts
		opts.Name = "tap · " + msg.addr
		opts.Back = func() tea.Msg { return backMsg{} }
		p.inner, p.addr = New(msg.src, opts), msg.addr
		_, cmd := p.inner.Update(tea.WindowSizeMsg{Width: p.width, Height: p.height})
		return p, p.wrap(tea.Batch(p.inner.Init(), cmd))
	case backMsg:
		p.close()
		return p, p.fetch()
	case innerMsg:
		if msg.gen != p.gen || p.inner == nil {
			return p, nil // a closed dashboard's
		}
		_, cmd := p.inner.Update(msg.msg)
		return p, p.wrap(cmd)
	}
	if p.inner != nil {
		_, cmd := p.inner.Update(msg)
		return p, p.wrap(cmd)
	}
	if k, ok := msg.(tea.KeyPressMsg); ok {
		return p, p.onKey(k)
	}
	return p, nil
}

func (p *Picker) close() {
	if p.inner != nil {
		p.inner.src.Close()
		_ = p.inner.finishRecording()
	}
	p.inner = nil
	p.gen++
}

func (p *Picker) onKey(k tea.KeyPressMsg) tea.Cmd {
	switch {
	case key.Matches(k, p.keys.Quit):
		return tea.Quit
	case key.Matches(k, p.keys.Up):
		p.cursor = max(p.cursor-1, 0)
	case key.Matches(k, p.keys.Down):
		p.cursor = min(p.cursor+1, max(len(p.rows)-1, 0))
	case key.Matches(k, p.keys.Sort):
		p.sort = (p.sort + 1) % len(pickerSorts)
		at := ""
		if p.cursor < len(p.rows) {
			at = p.rows[p.cursor].Address
		}
		p.sortRows(at)
	case key.Matches(k, p.keys.Refresh):
		return p.fetch()
	case key.Matches(k, p.keys.Open):
		if p.cursor >= len(p.rows) {
			return nil
		}
		addr, f := p.rows[p.cursor].Address, p.fleet
		return func() tea.Msg {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			src, err := f.Open(ctx, addr)
			return openedMsg{addr, src, err}
		}
	}
	return nil
}

// sortRows orders the table, decode instances first, keeping the cursor on the instance at
// (the first row when it is gone).
func (p *Picker) sortRows(at string) {
	s := pickerSorts[p.sort]
	slices.SortStableFunc(p.rows, func(a, b FleetRow) int {
		if da, db := a.Role == "decode", b.Role == "decode"; da != db {
			if da {
				return -1
			}
			return 1
		}
		if c := s.less(a, b); c != 0 {
			return c
		}
		return strings.Compare(a.Address, b.Address)
	})
	p.cursor = max(slices.IndexFunc(p.rows, func(r FleetRow) bool { return r.Address == at }), 0)
}

// wrap tags what an open dashboard's commands bring back with its generation; the
// runtime's own messages (and batches, whose commands are wrapped in turn) go as they are.
func (p *Picker) wrap(cmd tea.Cmd) tea.Cmd { return wrapGen(p.gen, cmd) }

func wrapGen(gen int, cmd tea.Cmd) tea.Cmd {
	if cmd == nil {
		return nil
	}
	return func() tea.Msg {
		switch msg := cmd().(type) {
		case tea.BatchMsg:
			out := make(tea.BatchMsg, len(msg))
			for i, c := range msg {
				out[i] = wrapGen(gen, c)
			}
			return out
		case updateMsg, sourceDoneMsg, frameMsg, linkTickMsg, controlDoneMsg, seekMsg, recordDoneMsg:
			return innerMsg{gen, msg}
		default:
			return msg
		}
	}
}

// View draws the table, or the open dashboard.
func (p *Picker) View() tea.View {
	if p.inner != nil {
		return p.inner.View()
	}
	v := tea.NewView(p.table())
	v.AltScreen = true
	v.WindowTitle = "kvtop tap"
	return v
}

// table draws the fleet table: one row per instance, decode instances first.
func (p *Picker) table() string {
	st := p.st
	var b strings.Builder
	b.WriteString(st.Title.Render("kvtop") + " " + st.Value.Render("tap") + " · " + fmt.Sprintf("%d instances", len(p.rows)) +
		" · sorted by " + pickerSorts[p.sort].name)
	if p.err != nil {
		b.WriteString(" · " + st.Error.Render(p.err.Error()))
	}
	b.WriteString("\n\n")
	head := fmt.Sprintf("  %-22s %-8s %7s %8s %7s %6s %11s %6s %8s %5s  %s", "INSTANCE", "ROLE", "WAITING", "PREPARED", "RUNNING", "STUCK", "PAGES USED", "FREE", "OLDEST", "DIV", "WHY / STANDING")
	b.WriteString(st.Heading.Render(ansi.Truncate(head, p.width, "…")) + "\n")
	for i, r := range p.rows {
		why := r.Standing
		if r.Why != "" {
			why = r.Head + ": " + r.Why
		}
		if r.Note != "" {
			why = r.Note
		}
		oldest := "-"
		if r.Oldest > 0 {
			oldest = r.Oldest.Round(100 * time.Millisecond).String()
		}
		line := fmt.Sprintf("  %-22s %-8s %7d %8d %7d %6d %11s %6s %8s %5d  %s", ansi.Truncate(r.Address, 22, "…"), r.Role,
			r.Waiting, r.Prepared, r.Running, r.Stuck, humanize.Comma(int64(r.Used)), humanize.Comma(int64(r.Free)), oldest, r.Divergences, why)
		line = ansi.Truncate(line, p.width, "…")
		switch {
		case i == p.cursor:
			line = st.Cursor.Render("▸" + line[1:])
		case r.Stuck > 0:
			line = st.Stuck.Render(line)
		case r.Divergences > 0:
			line = st.Warn.Render(line)
		}
		b.WriteString(line + "\n")
	}
	if len(p.rows) == 0 {
		b.WriteString(st.Dim.Render("  no instance yet: start MLC's router with HTTP_PROXY pointing at the tap") + "\n")
	}
	b.WriteString("\n" + st.Footer.Render("enter open · esc back (from a dashboard) · ↑↓ move · s sort · r refresh · q quit"))
	return b.String()
}

// RunPicker runs the instance picker on the terminal until the user quits or ctx is done.
func RunPicker(ctx context.Context, fleet Fleet, opts Options) error {
	if opts.NoColor {
		opts.Profile = colorprofile.ASCII
	} else if opts.Profile == colorprofile.Unknown {
		opts.Profile = colorprofile.Detect(os.Stdout, os.Environ())
	}
	p := NewPicker(fleet, opts)
	_, err := tea.NewProgram(p, tea.WithContext(ctx), tea.WithColorProfile(opts.Profile)).Run()
	p.close()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
