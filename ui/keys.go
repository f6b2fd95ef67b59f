package ui

import "charm.land/bubbles/v2/key"

// KeyMap is every binding of the dashboard. The help overlay lists them from here, and
// Update matches keys with key.Matches against them, never against string literals.
type KeyMap struct {
	Help      key.Binding
	Quit      key.Binding
	ForceQuit key.Binding // quits even while a prompt is open
	NextPanel key.Binding
	PrevPanel key.Binding
	Panel     [numPanels]key.Binding // 1…7
	// Panels stands for the number keys in the help.
	Panels   key.Binding
	Up       key.Binding
	Down     key.Binding
	Left     key.Binding
	Right    key.Binding
	PageUp   key.Binding
	PageDown key.Binding
	Home     key.Binding
	End      key.Binding
	Enter    key.Binding
	Back     key.Binding
	Filter   key.Binding
	Sort     key.Binding
	Reverse  key.Binding
	Pause    key.Binding
	Step     key.Binding
	Resync   key.Binding
	// Zoom shows the overview's focused panel full screen, and the overview again.
	Zoom key.Binding
	// StepBack, StepForward, JumpBack and JumpForward rewind the view a step or a hundred;
	// Live goes back to the live view.
	StepBack    key.Binding
	StepForward key.Binding
	JumpBack    key.Binding
	JumpForward key.Binding
	Live        key.Binding
	// Record starts a recording of the history held and everything after, and stops it.
	Record key.Binding
	// AllEvents shows the routine events the log folds; ByRequest groups the log by
	// request.
	AllEvents key.Binding
	ByRequest key.Binding
	// Faster, Slower and Seek drive a recording played back (kvtop replay).
	Faster key.Binding
	Slower key.Binding
	Seek   key.Binding
	// AcceptPrompt and CancelPrompt close the filter and go-to-step prompts; every other
	// key goes to the prompt's textinput.Model.
	AcceptPrompt key.Binding
	CancelPrompt key.Binding
}

// DefaultKeyMap returns kvtop's bindings.
func DefaultKeyMap() KeyMap {
	k := KeyMap{
		Help:      key.NewBinding(key.WithKeys("?"), key.WithHelp("?", "help")),
		Quit:      key.NewBinding(key.WithKeys("q", "ctrl+c"), key.WithHelp("q/ctrl+c", "quit")),
		ForceQuit: key.NewBinding(key.WithKeys("ctrl+c"), key.WithHelp("ctrl+c", "quit")),
		NextPanel: key.NewBinding(key.WithKeys("tab"), key.WithHelp("tab", "next panel")),
		PrevPanel: key.NewBinding(key.WithKeys("shift+tab"), key.WithHelp("shift+tab", "prev panel")),
		Up:        key.NewBinding(key.WithKeys("up", "k"), key.WithHelp("↑/k", "up")),
		Down:      key.NewBinding(key.WithKeys("down", "j"), key.WithHelp("↓/j", "down")),
		Left:      key.NewBinding(key.WithKeys("left", "h"), key.WithHelp("←/h", "left")),
		Right:     key.NewBinding(key.WithKeys("right", "l"), key.WithHelp("→/l", "right")),
		PageUp:    key.NewBinding(key.WithKeys("pgup", "ctrl+u"), key.WithHelp("pgup", "page up")),
		PageDown:  key.NewBinding(key.WithKeys("pgdown", "ctrl+d"), key.WithHelp("pgdn", "page down")),
		Home:      key.NewBinding(key.WithKeys("home", "g"), key.WithHelp("g/home", "first")),
		End:       key.NewBinding(key.WithKeys("end", "G"), key.WithHelp("G/end", "last (follow)")),
		Enter:     key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "open request")),
		Back:      key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "back")),
		Filter:    key.NewBinding(key.WithKeys("/"), key.WithHelp("/", "filter: regex, ! inverts")),
		Sort:      key.NewBinding(key.WithKeys("s"), key.WithHelp("s", "sort key")),
		Reverse:   key.NewBinding(key.WithKeys("S"), key.WithHelp("S", "reverse sort")),
		Pause:     key.NewBinding(key.WithKeys("p"), key.WithHelp("p", "pause: freeze the view")),
		Step:      key.NewBinding(key.WithKeys("space", "n"), key.WithHelp("space/n", "single step")),
		Resync:    key.NewBinding(key.WithKeys("r"), key.WithHelp("r", "resync: new snapshot")),
		Zoom:      key.NewBinding(key.WithKeys("z"), key.WithHelp("z", "zoom / overview")),
		Panels:    key.NewBinding(key.WithKeys("1", "2", "3", "4", "5", "6", "7"), key.WithHelp("1…7", "a panel, as numbered")),

		StepBack:    key.NewBinding(key.WithKeys("["), key.WithHelp("[", "rewind a step")),
		StepForward: key.NewBinding(key.WithKeys("]"), key.WithHelp("]", "forward a step")),
		JumpBack:    key.NewBinding(key.WithKeys("{"), key.WithHelp("{", "rewind 100 steps")),
		JumpForward: key.NewBinding(key.WithKeys("}"), key.WithHelp("}", "forward 100 steps")),
		Live:        key.NewBinding(key.WithKeys("L"), key.WithHelp("L", "back to live")),
		Record:      key.NewBinding(key.WithKeys("R"), key.WithHelp("R", "record (R again stops)")),
		AllEvents:   key.NewBinding(key.WithKeys("a"), key.WithHelp("a", "events: all / folded")),
		ByRequest:   key.NewBinding(key.WithKeys("i"), key.WithHelp("i", "events: by request")),
		Faster:      key.NewBinding(key.WithKeys("+", "="), key.WithHelp("+", "replay faster")),
		Slower:      key.NewBinding(key.WithKeys("-"), key.WithHelp("-", "replay slower")),
		Seek:        key.NewBinding(key.WithKeys(":"), key.WithHelp(":", "go to step")),

		AcceptPrompt: key.NewBinding(key.WithKeys("enter"), key.WithHelp("enter", "keep")),
		CancelPrompt: key.NewBinding(key.WithKeys("esc"), key.WithHelp("esc", "clear")),
	}
	for i := range k.Panel {
		d := string(rune('1' + i))
		k.Panel[i] = key.NewBinding(key.WithKeys(d), key.WithHelp(d, panelNames[i]))
	}
	return k
}

// ShortHelp is the footer's one line.
func (k KeyMap) ShortHelp() []key.Binding {
	return []key.Binding{k.Help, k.NextPanel, k.Enter, k.StepBack, k.Live, k.Filter, k.Pause, k.Step, k.Quit}
}

// FullHelp is the help overlay, a column a group.
func (k KeyMap) FullHelp() [][]key.Binding {
	return [][]key.Binding{
		{k.Help, k.Quit, k.NextPanel, k.PrevPanel, k.Zoom, k.Panels},
		{k.Up, k.Down, k.Left, k.Right, k.PageUp},
		{k.PageDown, k.Home, k.End, k.Enter, k.Back},
		{k.Filter, k.Sort, k.Reverse, k.AllEvents, k.ByRequest, k.Pause, k.Step, k.Resync, k.Faster, k.Slower},
		{k.StepBack, k.StepForward, k.JumpBack, k.JumpForward, k.Live, k.Seek, k.Record},
	}
}
