package prefix

// AppendTokens appends to dst the committed tokens of sequence id from position from to its
// end: the tokens on the path from the root to the node where the sequence ends. Pending
// extensions are not included (the length is Sequence's). It reports false, appending
// nothing, when the cache does not hold id or from is outside [0, length].
//
// It reads the tree and changes nothing: an exporter uses it to learn the tokens of what
// the tree reports as changed (TakeChanges says which nodes, not which tokens).
func (c *Cache) AppendTokens(dst []int32, id int64, from int) ([]int32, bool) {
	e := c.lookup(id)
	if e == nil || from < 0 || from > e.node.depth {
		return dst, false
	}
	// The nodes that hold [from, depth), deepest first: usually one or two.
	var stack [8]*node
	path := stack[:0]
	for n := e.node; n != nil && n.depth > from; n = n.parent {
		path = append(path, n)
	}
	for i := len(path) - 1; i >= 0; i-- {
		n := path[i]
		start := n.depth - len(n.toks)
		dst = append(dst, n.toks[max(from-start, 0):]...)
	}
	return dst, true
}
