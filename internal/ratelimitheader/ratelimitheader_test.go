package ratelimitheader

import (
	"fmt"
	"testing"
	"time"
)

func TestValues(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Policy("a", 0, 5), `"a";q=5`},
		{Policy("a", 1, 5), `"a";q=5;w=1`},
		{Policy("a", 3600e9, 5), `"a";q=5;w=3600`},
		{Policy("a", 3600e9+1, 5), `"a";q=5;w=3601`},
		{Policy(`q"\`, 1e9, 5), `"q\"\\";q=5;w=1`},
		{Policy("é\x01b", 1e9, 5), `"b";q=5;w=1`},
		{Value("a", 0, 0), `"a";r=0;t=0`},
		{Value("a", 3, 1), `"a";r=3;t=1`},
		{Value("a", 3, 2e9), `"a";r=3;t=2`},
		{fmt.Sprint(Seconds(-time.Second)), "0"},
		{fmt.Sprint(CeilUnits(1, time.Millisecond)), "1"},
		{fmt.Sprint(CeilUnits(1<<63-1, time.Millisecond)), "9223372036855"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}
