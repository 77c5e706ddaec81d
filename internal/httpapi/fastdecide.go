package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/ratelimiter/ratelimiter/internal/limiter"
)

// The decision operations (decide, peek, charge and refund) are as hot as
// an acquire, and kin-openapi would spend more on validating one than the
// decision costs on Redis. checkDecide reads their body and
// checkOnceHeader their Idempotency-Key by hand, as strictly as the spec
// (TestFastValidationAgreesWithSpec).

// itemsKey is the context key of the items checkDecide read.
type itemsKey struct{}

// withItems hands the generated handler the items validateFast read,
// which the generated code has no other way to carry.
func withItems(r *http.Request, items []limiter.Item) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), itemsKey{}, items))
}

// itemsOf returns the items validateFast read, if it did.
func itemsOf(ctx context.Context) ([]limiter.Item, bool) {
	items, ok := ctx.Value(itemsKey{}).([]limiter.Item)
	return items, ok
}

// checkDecide reads a DecideRequest body, which is valid JSON: an object
// whose only member is "items", an array of 1 to limiter.MaxItems objects
// read as a batch's acquisitions are. Permits default to 1.
func checkDecide(data []byte) ([]limiter.Item, *problem) {
	var items []limiter.Item
	p := checkEnvelope(data, "items", func(value []byte) *problem {
		items = make([]limiter.Item, 0, min(len(value)/len(`{"limiter":"x"},`)+1, limiter.MaxItems))
		return checkList(value, "body.items", limiter.MaxItems, func(r limiter.Request) { items = append(items, limiter.Item(r)) })
	})
	if p != nil {
		return nil, p
	}
	return items, nil
}

// onceKeyPattern is the pattern of the IdempotencyKey parameter.
const onceKeyPattern = "^[A-Za-z0-9._:-]+$"

// checkOnceHeader tells what is wrong with the Idempotency-Key header of
// h, by the IdempotencyKey parameter's schema, or returns nil. A header
// sent more than once is the generated code's to refuse.
func checkOnceHeader(h http.Header) *problem {
	vs := h[hdrIdempotencyKey]
	if len(vs) != 1 {
		return nil
	}
	const where = "header." + hdrIdempotencyKey
	switch v := vs[0]; {
	case v == "":
		return invalid(where, "must not be empty")
	case utf8.RuneCountInString(v) > limiter.MaxOnceKeyLen:
		return invalid(where, fmt.Sprintf("must be at most %d characters long", limiter.MaxOnceKeyLen))
	case limiter.CheckOnceKey(v) != nil:
		return invalid(where, "must match the pattern "+onceKeyPattern)
	}
	return nil
}
