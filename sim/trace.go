package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// TraceBlock is the token block size of a Mooncake trace's hash_ids.
const TraceBlock = 512

// TraceRecord is one line of a Mooncake-format trace (FAST'25 release): when the request
// arrived, its input and output lengths, and the hashes of its 512-token prompt blocks
// (equal ids mean equal blocks; the last block may be partial).
type TraceRecord struct {
	Timestamp    int64   `json:"timestamp"` // milliseconds from the start
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// ErrBadTrace is returned for a trace line that does not describe a request.
var ErrBadTrace = errors.New("sim: bad trace")

// ReadTrace reads a Mooncake-format JSONL trace, checking every line.
func ReadTrace(r io.Reader) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var out []TraceRecord
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrBadTrace, line, err)
		}
		if err := rec.check(); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrBadTrace, line, err)
		}
		if len(out) > 0 && rec.Timestamp < out[len(out)-1].Timestamp {
			return nil, fmt.Errorf("%w: line %d: timestamp %d before the previous line's %d", ErrBadTrace, line, rec.Timestamp, out[len(out)-1].Timestamp)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrBadTrace, line+1, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrBadTrace)
	}
	return out, nil
}

func (rec TraceRecord) check() error {
	n := len(rec.HashIDs)
	switch {
	case rec.Timestamp < 0:
		return fmt.Errorf("negative timestamp %d", rec.Timestamp)
	case rec.InputLength < 2:
		return fmt.Errorf("input_length %d: a prompt needs at least 2 tokens", rec.InputLength)
	case rec.OutputLength < 1:
		return fmt.Errorf("output_length %d must be positive", rec.OutputLength)
	case n == 0:
		return errors.New("no hash_ids")
	case rec.InputLength > n*TraceBlock || rec.InputLength <= (n-1)*TraceBlock:
		return fmt.Errorf("input_length %d does not fit %d blocks of %d", rec.InputLength, n, TraceBlock)
	}
	for _, h := range rec.HashIDs {
		if h < 0 || h > (1<<31-1-tokenBase)/TraceBlock {
			return fmt.Errorf("hash id %d out of range", h)
		}
	}
	return nil
}

// Tokens returns the record's prompt: block h's i-th token is tokenBase + h×512 + i, so equal
// block ids give equal token blocks and different ones never match.
func (rec TraceRecord) Tokens() []int32 {
	out := make([]int32, rec.InputLength)
	for i := range out {
		h := rec.HashIDs[i/TraceBlock]
		out[i] = int32(tokenBase + h*TraceBlock + int64(i%TraceBlock))
	}
	return out
}

// ReuseBound is the share of 512-token blocks that repeat a block seen earlier in the
// trace: an upper bound of the prefix hit ratio any cache can reach on it, by blocks.
func ReuseBound(recs []TraceRecord) float64 {
	seen := map[int64]bool{}
	total, repeat := 0, 0
	for _, rec := range recs {
		for _, h := range rec.HashIDs {
			total++
			if seen[h] {
				repeat++
			}
			seen[h] = true
		}
	}
	if total == 0 {
		return 0
	}
	return float64(repeat) / float64(total)
}

// trace replays a trace: each record arrives at its timestamp divided by speed.
type trace struct {
	recs  []TraceRecord
	speed float64
	next  int
}

// NewTrace returns a workload replaying records, time scaled by speed (2 plays twice as fast).
func NewTrace(recs []TraceRecord, speed float64) Workload {
	if speed <= 0 {
		speed = 1
	}
	return &trace{recs: recs, speed: speed}
}

func (w *trace) Due(now time.Duration) []Arrival {
	var out []Arrival
	for w.next < len(w.recs) {
		rec := w.recs[w.next]
		at := time.Duration(float64(rec.Timestamp) / w.speed * float64(time.Millisecond))
		if at > now {
			break
		}
		out = append(out, Arrival{At: at, ID: fmt.Sprintf("t%d", w.next), Prompt: rec.Tokens(), MaxTokens: rec.OutputLength, Conv: -1})
		w.next++
	}
	return out
}

func (w *trace) Finished(Arrival, []int32, string, time.Duration) {}

// Remaining returns how many records have not arrived yet.
func (w *trace) Remaining() int { return len(w.recs) - w.next }
