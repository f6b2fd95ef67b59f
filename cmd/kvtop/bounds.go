package main

import (
	"flag"
	"fmt"
	"math"
	"time"
)

// bound is the range a numeric flag accepts. Every numeric flag of every command has one
// (TestEveryNumericFlagIsBounded holds it), and checkBounds checks the flags given before
// anything starts: a value out of range, NaN or an infinity is a usage error with the
// reason, never a size that overflows later.
type bound struct {
	lo, hi float64 // for float flags; NaN and ±Inf are always refused
	// loOpen excludes lo itself (speeds must be positive).
	loOpen bool
	// zeroOK accepts 0 besides [lo, hi] (steps-per-sec: 0 is as fast as possible).
	zeroOK bool
	// ilo, ihi are the range of an integer or duration flag (durations in nanoseconds).
	ilo, ihi int64
	// any accepts every value the flag can parse (the seed).
	any bool
}

func ints(lo, hi int64) bound                  { return bound{ilo: lo, ihi: hi} }
func durations(lo, hi time.Duration) bound     { return bound{ilo: int64(lo), ihi: int64(hi)} }
func floats(lo, hi float64, loOpen bool) bound { return bound{lo: lo, hi: hi, loOpen: loOpen} }

// The largest values the engine's sizes may take. They keep every size computed from them
// (pages, slots, channel buffers, rings) far from overflow and within a host's memory.
const (
	maxTotalSeqLen = 1 << 25 // 33,554,432 tokens: 2M pages of 16
	maxSeqs        = 1 << 16
	maxInt32       = math.MaxInt32
	maxDay         = 24 * time.Hour
	maxRate        = 1e6
)

// engineBounds are the engine flags' ranges, shared by the demo and serve. Config.Validate
// checks how they combine (a page within the capacity, the arena within its limit).
var engineBounds = map[string]bound{
	"page-size":          ints(1, 1024),
	"max-total-seq-len":  ints(1, maxTotalSeqLen),
	"max-num-seq":        ints(1, maxSeqs),
	"max-single-seq-len": ints(2, maxInt32),
	"prefill-chunk":      ints(1, maxInt32),
	"max-recycling":      ints(-2, maxInt32),
	"watermark":          ints(0, maxInt32),
	"spec-draft-len":     ints(0, 1024),
	"models":             ints(1, 4),
	"arena-limit":        ints(0, 1<<40),
	"age-limit":          durations(0, math.MaxInt64),
	"reclaim-after":      durations(0, math.MaxInt64),
	"seed":               {any: true},
	"keep-finished":      ints(0, 1<<20),
	"steps-per-sec":      {lo: 0.001, hi: maxRate, zeroOK: true},
}

// checkBounds checks every flag given on the command line that has a bound in one of bs.
func checkBounds(fs *flag.FlagSet, bs ...map[string]bound) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err != nil {
			return
		}
		for _, b := range bs {
			if bd, ok := b[f.Name]; ok {
				err = bd.check(f)
				return
			}
		}
	})
	return err
}

// check reports a flag's value outside the bound, with the range it wants.
func (b bound) check(f *flag.Flag) error {
	if b.any {
		return nil
	}
	v := f.Value.(flag.Getter).Get()
	switch v := v.(type) {
	case float64:
		ok := !math.IsNaN(v) && !math.IsInf(v, 0) && v <= b.hi && (v > b.lo || v == b.lo && !b.loOpen)
		if ok || b.zeroOK && v == 0 {
			return nil
		}
		lo := "["
		if b.loOpen {
			lo = "("
		}
		want := fmt.Sprintf("a number in %s%g, %g]", lo, b.lo, b.hi)
		if b.zeroOK {
			want = "0 or " + want
		}
		return fmt.Errorf("--%s %s must be %s", f.Name, f.Value, want)
	case time.Duration:
		if int64(v) >= b.ilo && int64(v) <= b.ihi {
			return nil
		}
		return fmt.Errorf("--%s %s must be in [%v, %v]", f.Name, f.Value, time.Duration(b.ilo), time.Duration(b.ihi))
	case int:
		return b.checkInt(f, int64(v))
	case int64:
		return b.checkInt(f, v)
	}
	panic(fmt.Sprintf("kvtop: flag --%s: no bound check for %T", f.Name, v))
}

func (b bound) checkInt(f *flag.Flag, v int64) error {
	if v >= b.ilo && v <= b.ihi {
		return nil
	}
	return fmt.Errorf("--%s %d must be in [%d, %d]", f.Name, v, b.ilo, b.ihi)
}
