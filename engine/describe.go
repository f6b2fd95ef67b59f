package engine

import (
	"fmt"
	"strings"
)

// DescribeReady is the one text form of a step's output, used by logs, golden tests and
// debugging: a header line, then each event on its own line, then the streamed tokens by
// request.
func DescribeReady(rd Ready) string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d (%s)\n", rd.Step, rd.Action)
	describeEvents(&b, rd.Events)
	if len(rd.Tokens) > 0 {
		b.WriteString("tokens:")
		for _, t := range rd.Tokens {
			switch {
			case t.Token < 0:
				fmt.Fprintf(&b, " %s(end:%s)", t.ID, t.FinishReason)
			case t.Final:
				fmt.Fprintf(&b, " %s#%d(final:%s)", t.ID, t.Index, t.FinishReason)
			default:
				fmt.Fprintf(&b, " %s#%d", t.ID, t.Index)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// DescribeEvents writes events one a line, as DescribeReady does.
func DescribeEvents(evs []Event) string {
	var b strings.Builder
	describeEvents(&b, evs)
	return b.String()
}

func describeEvents(b *strings.Builder, evs []Event) {
	for _, ev := range evs {
		b.WriteString("  ")
		b.WriteString(ev.String())
		b.WriteByte('\n')
	}
}
