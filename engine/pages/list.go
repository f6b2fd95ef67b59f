package pages

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// List is a list of page (or block) ids that encodes compactly in JSON: runs of consecutive
// ids, ascending or descending, as "a-b" strings, and single ids as "a". A fresh cache's free
// list of 65,536 pages is ["65535-0"].
type List []int32

// MarshalJSON writes the runs.
func (l List) MarshalJSON() ([]byte, error) {
	out := make([]string, 0, 4)
	for i := 0; i < len(l); {
		j := i + 1
		step := int32(0)
		if j < len(l) && (l[j] == l[i]+1 || l[j] == l[i]-1) {
			step = l[j] - l[i]
			for j < len(l) && l[j] == l[j-1]+step {
				j++
			}
		}
		if j-i == 1 {
			out = append(out, strconv.Itoa(int(l[i])))
		} else {
			out = append(out, fmt.Sprintf("%d-%d", l[i], l[j-1]))
		}
		i = j
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads the runs, refusing anything else, and lists longer than 1<<24 ids.
func (l *List) UnmarshalJSON(b []byte) error {
	var runs []string
	if err := json.Unmarshal(b, &runs); err != nil {
		return fmt.Errorf("pages: page list: %w", err)
	}
	out := List{}
	for _, r := range runs {
		a, z, found := strings.Cut(r, "-")
		x, err1 := strconv.ParseInt(a, 10, 32)
		y := x
		var err2 error
		if found {
			y, err2 = strconv.ParseInt(z, 10, 32)
		}
		if err1 != nil || err2 != nil || x < 0 || y < 0 {
			return fmt.Errorf("pages: page list: bad run %q", r)
		}
		n := y - x
		if n < 0 {
			n = -n
		}
		if int64(len(out))+n+1 > 1<<24 {
			return fmt.Errorf("pages: page list: more than %d ids", 1<<24)
		}
		step := int64(1)
		if y < x {
			step = -1
		}
		for v := x; ; v += step {
			out = append(out, int32(v))
			if v == y {
				break
			}
		}
	}
	*l = out
	return nil
}
