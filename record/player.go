package record

import (
	"context"
	"fmt"
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
type Player struct {
	rec  *Recording
	name string

	signal chan struct{}
	ctrl   chan feed.Control
	done   chan struct{}
	cancel context.CancelFunc

	mu      sync.Mutex
	pending feed.Update
	status  feed.Status
	link    feed.Link
}

// NewPlayer returns a player for rec, starting paused at the first snapshot when paused is
// set. speed is a multiple of real time. Call Run.
func NewPlayer(rec *Recording, name string, speed float64, paused bool) *Player {
	if speed <= 0 {
		speed = 1
	}
	p := &Player{
		rec:    rec,
		name:   name,
		signal: make(chan struct{}, 1),
		ctrl:   make(chan feed.Control, 16),
		done:   make(chan struct{}),
		status: feed.Status{Paused: paused, Rate: speed, Target: speed, Controllable: true},
		link:   feed.Link{Name: "replay " + name, State: feed.LinkUp},
	}
	return p
}

// Run plays until ctx is done or Close is called.
func (p *Player) Run(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(ctx)
	defer close(p.done)
	items := p.rec.items
	view, err := engine.NewView(*items[0].snap)
	if err != nil {
		p.setLink(feed.LinkClosed, err.Error())
		return
	}
	snap := *items[0].snap
	p.push(feed.Update{Snapshot: &snap})
	pos := 1
	recNow := items[0].at
	// While paused, a step request plays everything stamped up to target: an engine step
	// and the calls that came after it.
	stepping, target := false, uint64(0)
	cur := items[0].step
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		paused, speed := p.status.Paused, p.status.Target
		p.mu.Unlock()
		atEnd := pos >= len(items)
		if stepping && (atEnd || items[pos].step > target) {
			stepping = false
		}
		var wait time.Duration
		switch {
		case atEnd || (paused && !stepping):
			wait = -1
		case stepping:
			wait = 0
		default:
			gap := time.Duration(items[pos].at-recNow) * time.Millisecond
			wait = min(max(gap, 0), maxGap)
			wait = time.Duration(float64(wait) / speed)
		}
		if atEnd {
			p.setLink(feed.LinkUp, fmt.Sprintf("end of the recording at step %d", items[len(items)-1].step))
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
				close(p.signal)
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
					p.replace(&s)
				case feed.ControlSeek:
					v, next, err := p.rec.StateAt(uint64(c.N))
					if err != nil {
						p.setLink(feed.LinkUp, err.Error())
						break
					}
					view, pos, stepping = v, next, false
					cur = uint64(c.N)
					if pos < len(items) {
						recNow = items[pos].at
					}
					s := view.Snapshot()
					p.replace(&s)
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
		it := items[pos]
		pos++
		recNow, cur = it.at, it.step
		if it.snap != nil {
			v, err := engine.NewView(*it.snap)
			if err == nil {
				view = v
			}
			s := *it.snap
			p.replace(&s)
			continue
		}
		if err := view.Apply(it.ev); err != nil {
			p.setLink(feed.LinkUp, err.Error())
		}
		p.push(feed.Update{Events: []engine.Event{it.ev}})
	}
}

func (p *Player) push(u feed.Update) {
	p.mu.Lock()
	if u.Snapshot != nil {
		p.pending.Snapshot = u.Snapshot
		p.pending.Events = nil
	}
	p.pending.Events = append(p.pending.Events, u.Events...)
	p.mu.Unlock()
	p.notify()
}

// replace drops what is pending for a fresh state.
func (p *Player) replace(s *engine.Snapshot) { p.push(feed.Update{Snapshot: s}) }

func (p *Player) setStatus(f func(*feed.Status)) {
	p.mu.Lock()
	f(&p.status)
	st := p.status
	p.pending.Status = &st
	p.mu.Unlock()
	p.notify()
}

func (p *Player) setLink(state feed.LinkState, msg string) {
	p.mu.Lock()
	changed := p.link.State != state || p.link.Err != msg
	p.link.State, p.link.Err = state, msg
	p.mu.Unlock()
	if changed {
		p.notify()
	}
}

func (p *Player) notify() {
	select {
	case p.signal <- struct{}{}:
	default:
	}
}

// C is signalled when updates are pending.
func (p *Player) C() <-chan struct{} { return p.signal }

// Take returns what is pending.
func (p *Player) Take() feed.Update {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.pending
	u.Dropped = p.rec.Dropped
	p.pending = feed.Update{}
	return u
}

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
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
}
