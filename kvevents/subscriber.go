package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// SubscriberConfig configures Subscribe.
type SubscriberConfig struct {
	// Endpoint is the publisher's PUB socket, tcp://HOST:PORT.
	Endpoint string
	// ReplayEndpoint, when set, is its replay socket: gaps in the sequence are filled from
	// it.
	ReplayEndpoint string
	// Topic is the topic subscribed to, a prefix (default all). Each topic's sequence is
	// followed on its own: a publisher of several streams (kvtop tap's, one a decode
	// instance) numbers each apart.
	Topic string
	// ReplayByTopic names the gap's topic in a replay request ([topic, start seq]), as a
	// publisher of several streams needs; vLLM's replay socket takes [start seq] alone.
	ReplayByTopic bool
	// FromStart asks the replay socket, once connected, for every batch it keeps from
	// sequence 0; with ReplayByTopic, for Topic's at once and for each other topic's when it
	// first shows.
	FromStart bool
	// ReplayTimeout bounds the wait for a replay's answer (default 5s).
	ReplayTimeout time.Duration
}

// Message is what a subscriber hands over: a batch, or a gap it could not fill.
type Message struct {
	Seq   uint64
	Topic string
	Batch Batch
	// Replayed says the batch came from the replay socket.
	Replayed bool
	// Missing, when not zero, says batches [Seq, Seq+Missing) were lost: neither the PUB
	// socket nor the replay kept them. Batch is then empty.
	Missing uint64
	// Err is a batch that could not be decoded; the subscriber goes on.
	Err error
}

// Subscribe connects to a vLLM-format publisher and calls f with every batch in sequence
// order, filling gaps from the replay socket when there is one, until ctx ends (nil) or f
// returns an error (that error).
func Subscribe(ctx context.Context, cfg SubscriberConfig, f func(Message) error) error {
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 5 * time.Second
	}
	ep, err := endpoint(cfg.Endpoint)
	if err != nil {
		return err
	}
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(200*time.Millisecond), zmq4.WithDialerMaxRetries(50))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, cfg.Topic); err != nil {
		return err
	}
	if err := sub.Dial(ep); err != nil {
		return fmt.Errorf("kv events: %s: %w", cfg.Endpoint, err)
	}
	s := &subscriber{ctx: ctx, cfg: cfg, f: f, seqs: map[string]*sequence{}}
	if cfg.ReplayEndpoint != "" {
		rep, err := endpoint(cfg.ReplayEndpoint)
		if err != nil {
			return err
		}
		s.dealer = zmq4.NewDealer(ctx, zmq4.WithDialerRetry(200*time.Millisecond), zmq4.WithDialerMaxRetries(50))
		defer s.dealer.Close()
		if err := s.dealer.Dial(rep); err != nil {
			return fmt.Errorf("kv events replay: %s: %w", cfg.ReplayEndpoint, err)
		}
		if cfg.FromStart && (!cfg.ReplayByTopic || cfg.Topic != "") {
			// The publisher's own stream, or, by topic, the one Topic names (when it names
			// one rather than a prefix of several, which then fill as they show).
			topic := ""
			if cfg.ReplayByTopic {
				topic = cfg.Topic
			}
			s.seq(topic).known = true
			if err := s.fill(topic, 0, ^uint64(0)); err != nil {
				return err
			}
		}
	}
	// The SUB socket's messages come through a goroutine, so that ctx can end the wait.
	msgs := make(chan zmq4.Msg, 256)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("kv events: %w", err)
		case m := <-msgs:
			topic, seq, payload, ok := splitLive(m.Frames)
			if !ok {
				if err := f(Message{Err: fmt.Errorf("%w: a message of %d frames, want [topic, seq, payload]", ErrMalformed, len(m.Frames))}); err != nil {
					return err
				}
				continue
			}
			if err := s.live(topic, seq, payload); err != nil {
				return err
			}
		}
	}
}

type subscriber struct {
	ctx    context.Context
	cfg    SubscriberConfig
	f      func(Message) error
	dealer zmq4.Socket
	seqs   map[string]*sequence // by topic
}

// sequence is where a topic's batches are.
type sequence struct {
	next  uint64 // the next sequence number expected
	known bool   // next is known (a batch was seen)
}

func (s *subscriber) seq(topic string) *sequence {
	q := s.seqs[topic]
	if q == nil {
		q = &sequence{}
		s.seqs[topic] = q
	}
	return q
}

func splitLive(fr [][]byte) (topic string, seq uint64, payload []byte, ok bool) {
	switch {
	case len(fr) == 3 && len(fr[1]) == 8:
		return string(fr[0]), binary.BigEndian.Uint64(fr[1]), fr[2], true
	case len(fr) == 2 && len(fr[0]) == 8:
		return "", binary.BigEndian.Uint64(fr[0]), fr[1], true
	}
	return "", 0, nil, false
}

func (s *subscriber) deliver(topic string, seq uint64, payload []byte, replayed bool) error {
	b, err := Decode(payload)
	q := s.seq(topic)
	q.next, q.known = seq+1, true
	return s.f(Message{Seq: seq, Topic: topic, Batch: b, Replayed: replayed, Err: err})
}

func (s *subscriber) live(topic string, seq uint64, payload []byte) error {
	q := s.seq(topic)
	if !q.known && s.cfg.FromStart && s.cfg.ReplayByTopic && s.dealer != nil {
		q.known = true // from 0: what came before this batch is filled first
	}
	switch {
	case q.known && seq < q.next:
		return nil // already had it, from a replay
	case q.known && seq > q.next:
		if err := s.fill(topic, q.next, seq); err != nil {
			return err
		}
		if seq < q.next {
			return nil
		}
	}
	return s.deliver(topic, seq, payload, false)
}

// fill asks the replay socket for topic's [from, to) and delivers what it keeps, in order;
// what it does not keep is reported missing.
func (s *subscriber) fill(topic string, from, to uint64) error {
	q := s.seq(topic)
	if s.dealer == nil {
		return s.missing(topic, from, to)
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	req := [][]byte{nil, start[:]}
	if s.cfg.ReplayByTopic {
		req = [][]byte{nil, []byte(topic), start[:]}
	}
	if err := s.dealer.SendMulti(zmq4.NewMsgFrom(req...)); err != nil {
		return fmt.Errorf("kv events replay: %w", err)
	}
	for {
		m, err := s.recvReplay()
		if err != nil {
			return err
		}
		fr := m.Frames
		if len(fr) > 0 && len(fr[0]) == 0 {
			fr = fr[1:] // the delimiter
		}
		if len(fr) == 3 {
			fr = fr[1:] // a publisher that sends the topic in replays too
		}
		if len(fr) != 2 || len(fr[0]) != 8 {
			return fmt.Errorf("kv events replay: %w: an answer of %d frames, want [seq, payload]", ErrMalformed, len(m.Frames))
		}
		if [8]byte(fr[0]) == endSeq {
			break
		}
		seq := binary.BigEndian.Uint64(fr[0])
		if seq < from || seq >= to || (q.known && seq < q.next) {
			continue
		}
		if q.known && seq > q.next {
			if err := s.missing(topic, q.next, seq); err != nil {
				return err
			}
		}
		if err := s.deliver(topic, seq, fr[1], true); err != nil {
			return err
		}
	}
	if to != ^uint64(0) && (!q.known || q.next < to) {
		return s.missing(topic, max(from, q.next), to)
	}
	return nil
}

func (s *subscriber) missing(topic string, from, to uint64) error {
	q := s.seq(topic)
	if !q.known || to <= from || to == ^uint64(0) {
		return nil
	}
	q.next = to
	return s.f(Message{Seq: from, Topic: topic, Missing: to - from})
}

// recvReplay waits for the replay socket's next message, at most ReplayTimeout.
func (s *subscriber) recvReplay() (zmq4.Msg, error) {
	type res struct {
		m   zmq4.Msg
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := s.dealer.Recv()
		ch <- res{m, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return r.m, fmt.Errorf("kv events replay: %w", r.err)
		}
		return r.m, nil
	case <-time.After(s.cfg.ReplayTimeout):
		return zmq4.Msg{}, errors.New("kv events replay: no answer")
	case <-s.ctx.Done():
		return zmq4.Msg{}, s.ctx.Err()
	}
}
