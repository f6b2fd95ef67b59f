package pages

// Compress appends to dst the compressed append-position map of slots (docs/kv-cache.md):
// [n, start_1, len_1, …, start_n, len_n], the slots in order cut into maximal runs of
// consecutive slot numbers. No slots gives the literal [0].
func Compress(dst []int64, slots []int64) []int64 {
	head := len(dst)
	dst = append(dst, 0)
	n := int64(0)
	for i := 0; i < len(slots); {
		j := i + 1
		for j < len(slots) && slots[j] == slots[j-1]+1 {
			j++
		}
		dst = append(dst, slots[i], int64(j-i))
		n++
		i = j
	}
	dst[head] = n
	return dst
}

// Run is a maximal run of consecutive slots.
type Run struct {
	Start int64 `json:"start"`
	Len   int64 `json:"len"`
}

// End returns the slot after the run.
func (r Run) End() int64 { return r.Start + r.Len }

// Expand appends the slots of runs to dst in order.
func Expand(dst []int64, runs []Run) []int64 {
	for _, r := range runs {
		for s := r.Start; s < r.End(); s++ {
			dst = append(dst, s)
		}
	}
	return dst
}
