package memory

// topK keeps the k best items offered to it, in O(log k) per offer: a heap
// whose root is the worst item kept, so that a better newcomer replaces it.
type topK[T any] struct {
	k     int
	items []T
	// better reports whether a ranks before b; it must be a strict total
	// order so that the answer does not depend on the order of offers.
	better func(a, b T) bool
}

func newTopK[T any](k int, better func(a, b T) bool) *topK[T] {
	return &topK[T]{k: k, items: make([]T, 0, min(k, 64)), better: better}
}

func (t *topK[T]) full() bool { return len(t.items) == t.k }

// worst is the item a newcomer must beat once the heap is full.
func (t *topK[T]) worst() T { return t.items[0] }

// offer keeps x if fewer than k items are kept or x beats the worst one.
func (t *topK[T]) offer(x T) {
	if len(t.items) < t.k {
		t.items = append(t.items, x)
		t.up(len(t.items) - 1)
		return
	}
	if !t.better(x, t.items[0]) {
		return
	}
	t.items[0] = x
	t.down(0)
}

// sorted empties the heap and returns its items, best first.
func (t *topK[T]) sorted() []T {
	out := make([]T, len(t.items))
	for i := len(out) - 1; i >= 0; i-- {
		out[i] = t.items[0]
		last := len(t.items) - 1
		t.items[0] = t.items[last]
		t.items = t.items[:last]
		t.down(0)
	}
	return out
}

// The heap keeps the worst item at the root: a parent is never better than
// its children.
func (t *topK[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.better(t.items[p], t.items[i]) {
			return
		}
		t.items[p], t.items[i] = t.items[i], t.items[p]
		i = p
	}
}

func (t *topK[T]) down(i int) {
	n := len(t.items)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && t.better(t.items[c], t.items[c+1]) {
			c++
		}
		if !t.better(t.items[i], t.items[c]) {
			return
		}
		t.items[i], t.items[c] = t.items[c], t.items[i]
		i = c
	}
}
