package config

import (
	"os"
	"strings"
	"testing"
)

// The README's configuration table is where users read what each setting
// means: every setting has a row there with its flag, its environment
// variable and its default, and every row names a setting that exists.
func TestReadmeTableListsEverySetting(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{} // flag -> cells
	for _, line := range strings.Split(string(readme), "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		flag := strings.TrimPrefix(strings.Trim(cells[0], "`"), "--")
		rows[flag] = cells
	}
	known := map[string]bool{"version": true}
	for _, s := range settings {
		known[s.name] = true
		cells, ok := rows[s.name]
		if !ok {
			t.Errorf("README configuration table: no row for --%s", s.name)
			continue
		}
		if len(cells) < 4 {
			t.Errorf("README row of --%s: got %d cells, want flag, environment, default, meaning", s.name, len(cells))
			continue
		}
		if got, want := cells[1], "`"+s.env+"`"; got != want {
			t.Errorf("README row of --%s: environment %s, want %s", s.name, got, want)
		}
		want := ""
		if s.def != "" {
			want = "`" + s.def + "`"
		}
		if cells[2] != want {
			t.Errorf("README row of --%s: default %s, want %q", s.name, cells[2], want)
		}
		if cells[3] == "" {
			t.Errorf("README row of --%s: no meaning", s.name)
		}
	}
	for flag := range rows {
		if !known[flag] {
			t.Errorf("README configuration table: row for --%s, which is no setting", flag)
		}
	}
}
