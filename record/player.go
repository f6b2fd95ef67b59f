package record

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kvtop/kvtop/engine"
	"github.com/kvtop/kvtop/feed"
)

// maxGap caps how long playback waits between two recorded moments, so an idle stretch of
// the recording does not look like a hang.
const maxGap = 2 * time.Second

// Player plays a recording back as a dashboard source: events come at their recorded pace
// times the speed; it can pause, step through the recording one engine step at a time, change
// speed and seek to any step. It satisfies the dashboard's Source interface.
//
// What it plays waits for the dashboard in a feed.Mailbox. A dashboard that falls more than
// the backlog behind loses the events, counted with those the recorded dashboard lost, and
// the player sends the state it has reached instead.
type Player struct {
	rec  *Recording
	name string
	mb   *feed.Mailbox

	ctrl chan feed.Control
	done chan struct{}

	mu     sync.Mutex
	cancel context.CancelFunc // set by Run
	status feed.Status
	link   feed.Link
}

// PlayerOptions configure a Player. The zero value plays at real time from the start.
type PlayerOptions struct {
	// Speed is a multiple of real time (default 1).
	Speed float64
	// Paused starts the player paused at the first snapshot.
	Paused bool
	// Backlog is how many events may wait for Take before the player drops them and sends
	// the state instead (default feed.DefaultBacklog).
	Backlog int
}

// NewPlayer returns a player for rec, named name in its Link. Call Run.
func NewPlayer(rec *Recording, name string, opts PlayerOptions) *Player {
	speed := opts.Speed
	if speed <= 0 {
		speed = 1
	}
	p := &Player{
		rec:    rec,
		name:   name,
		mb:     feed.NewMailbox(opts.Backlog),
		ctrl:   make(chan feed.Control, 16),
		done:   make(chan struct{}),
		status: feed.Status{Paused: opts.Paused, Rate: speed, Target: speed, Controllable: true},
		link:   feed.Link{Name: "replay " + name, State: feed.LinkUp, Err: rec.Truncated},
	}
	p.mb.AddDropped(rec.Dropped)
	return p
}

// Run plays until ctx is done or Close is called.
func (p *Player) Run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	p.mu.Lock()
	p.cancel = cancel
	p.mu.Unlock()
	defer close(p.done)
	defer p.mb.Close()
	rec := p.rec
	first := rec.at(0)
	view, err := engine.NewView(*first.snap)
	if err != nil {
		p.setLink(feed.LinkClosed, err.Error())
		return
	}
	snap := *first.snap
	p.mb.Snapshot(&snap)
	pos := 1
	recNow := first.at
	// While paused, a step request plays everything stamped up to target: an engine step
	// and the calls that came after it.
	stepping, target := false, uint64(0)
	cur, epoch := first.step, 0 // the step and the epoch played up to
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		paused, speed := p.status.Paused, p.status.Target
		p.mu.Unlock()
		atEnd := pos >= rec.n
		if stepping && (atEnd || rec.at(pos).step > target) {
			stepping = false
		}
		var wait time.Duration
		switch {
		case atEnd || (paused && !stepping):
			wait = -1
		case stepping:
			wait = 0
		default:
			gap := time.Duration(rec.at(pos).at-recNow) * time.Millisecond
			wait = min(max(gap, 0), maxGap)
			wait = time.Duration(float64(wait) / speed)
		}
		if atEnd {
			p.setLink(feed.LinkUp, fmt.Sprintf("end of the recording at step %d", rec.at(rec.n-1).step))
		}
		if wait != 0 {
			fired := false
			var tick <-chan time.Time
			if wait > 0 {
				timer.Reset(wait)
				tick = timer.C
			}
			select {
			case <-ctx.Done():
				p.setLink(feed.LinkClosed, "")
				return
			case c := <-p.ctrl:
				switch c.Op {
				case feed.ControlPause:
					p.setStatus(func(s *feed.Status) { s.Paused = true })
				case feed.ControlResume:
					stepping = false
					p.setStatus(func(s *feed.Status) { s.Paused = false })
				case feed.ControlStep:
					if !stepping {
						target = cur
					}
					stepping, target = true, target+uint64(c.N)
				case feed.ControlSpeed:
					p.setStatus(func(s *feed.Status) { s.Target = float64(c.N) / 100; s.Rate = s.Target })
				case feed.ControlSnapshot:
					s := view.Snapshot()
					p.mb.Snapshot(&s)
				case feed.ControlSeek:
					// Within the epoch being played when it holds the step: another
					// epoch's step numbers may be the same ones.
					e, ok := p.rec.Find(uint64(c.N), epoch)
					if !ok {
						p.setLink(feed.LinkUp, fmt.Sprintf("no step %d in the recording (%s)", c.N, describeEpochs(p.rec.Epochs())))
						break
					}
					v, next, err := p.rec.StateIn(e, uint64(c.N))
					if err != nil {
						p.setLink(feed.LinkUp, err.Error())
						break
					}
					view, pos, stepping = v, next, false
					cur, epoch = uint64(c.N), e
					if pos < rec.n {
						recNow = rec.at(pos).at
					}
					s := view.Snapshot()
					p.mb.Snapshot(&s)
					p.setStatus(func(s *feed.Status) { s.Paused = true })
				}
			case <-tick:
				fired = true
			}
			timer.Stop()
			if !fired {
				continue
			}
		}
		// Release the next recorded item.
		it := rec.at(pos)
		pos++
		if it.epoch != epoch && stepping {
			target = it.step + (target - cur) // the steps asked for go on in the new epoch
		}
		recNow, cur, epoch = it.at, it.step, it.epoch
		if it.snap != nil {
			v, err := engine.NewView(*it.snap)
			if err == nil {
				view = v
			}
			s := *it.snap
			p.mb.Snapshot(&s)
			continue
		}
		if err := view.Apply(it.ev); err != nil {
			p.setLink(feed.LinkUp, err.Error())
		}
		if !p.mb.Offer([]engine.Event{it.ev}) && p.mb.Owed() {
			// The dashboard fell behind: the state so far replaces what it lost.
			s := view.Snapshot()
			p.mb.Snapshot(&s)
		}
	}
}

func (p *Player) setStatus(f func(*feed.Status)) {
	p.mu.Lock()
	f(&p.status)
	st := p.status
	p.mu.Unlock()
	p.mb.SetStatus(st)
}

func (p *Player) setLink(state feed.LinkState, msg string) {
	p.mu.Lock()
	changed := p.link.State != state || p.link.Err != msg
	p.link.State, p.link.Err = state, msg
	p.mu.Unlock()
	if changed {
		p.mb.Notify()
	}
}

// C is signalled when updates are pending or the link changed, and closed when the player
// stops.
func (p *Player) C() <-chan struct{} { return p.mb.C() }

// Take returns what is pending; Dropped counts the events the recorded dashboard lost and
// those this one lost by falling behind.
func (p *Player) Take() feed.Update { return p.mb.Take() }

// Control pauses, resumes, steps, changes speed, seeks or resends the state.
func (p *Player) Control(c feed.Control) error {
	if err := c.Validate(); err != nil {
		return err
	}
	select {
	case p.ctrl <- c:
		return nil
	case <-p.done:
		return fmt.Errorf("record: the player has stopped")
	}
}

// Link reports the recording's name, and the end of it when reached.
func (p *Player) Link() feed.Link {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.link
}

// Close stops the player.
func (p *Player) Close() {
	p.mu.Lock()
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-p.done
	}
}

// describeEpochs names a recording's step ranges, for a message.
func describeEpochs(es []Epoch) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%d-%d", e.First, e.Last)
	}
	if len(es) == 1 {
		return "steps " + parts[0]
	}
	return fmt.Sprintf("%d epochs, steps %s", len(es), strings.Join(parts, ", "))
}
