package flagtable

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// pair is a text field: a flag read by its type.
type pair struct{ A, B int }

func (p pair) MarshalText() ([]byte, error) { return fmt.Appendf(nil, "%d:%d", p.A, p.B), nil }
func (p *pair) UnmarshalText(b []byte) error {
	if _, err := fmt.Sscanf(string(b), "%d:%d", &p.A, &p.B); err != nil {
		return fmt.Errorf("pair %q: give A:B", b)
	}
	return nil
}

// upper is a list field: a repeated flag read by its type.
type upper []string

func (u upper) FlagValues() []string { return []string(u) }
func (u *upper) SetFlagValues(vs []string) error {
	for _, v := range vs {
		if strings.ToUpper(v) != v {
			return fmt.Errorf("%q is not upper case", v)
		}
	}
	*u = vs
	return nil
}

type inner struct {
	Mode  string `flag:"on=yes,off=no" group:"g" usage:"switch on | switch off"`
	Quiet bool   `flag:"quiet" group:"g" usage:"say less"`
}

type table struct {
	inner
	Count int           `flag:"count" usage:"how many"`
	Name  string        `flag:"name" alias:"n" usage:"a name"`
	Wait  time.Duration `flag:"wait" usage:"how long"`
	Tags  []string      `flag:"tag" usage:"tags"`
	Pair  pair          `flag:"pair" usage:"A:B"`
	Upper upper         `flag:"upper" usage:"upper case words"`
	Note  string        // no tag: not a flag
}

func runTable(t *testing.T, flags []cli.Flag, args []string, read func(*cli.Context) error) error {
	t.Helper()
	app := &cli.App{Name: "t", Flags: flags, HideHelp: true, Writer: io.Discard, ErrWriter: io.Discard, Action: read, DisableSliceFlagSeparator: true}
	return app.Run(append([]string{"t"}, args...))
}

func TestTableFields(t *testing.T) {
	var names []string
	for _, f := range Fields(table{}) {
		names = append(names, f.Name)
	}
	if want := []string{"on", "off", "quiet", "count", "name", "wait", "tag", "pair", "upper"}; !slices.Equal(names, want) {
		t.Fatalf("fields %v, want %v", names, want)
	}
	on := Fields(&table{})[0]
	if on.Usage != "switch on" || on.Choice != "yes" || on.Group != "g" {
		t.Errorf("switch field %+v", on)
	}
}

// What Query renders, ReadInto reads back, through the flags Flags makes:
// one spelling serves the command line and the REST query.
func TestTableRoundTrip(t *testing.T) {
	want := table{inner: inner{Mode: "no", Quiet: true}, Count: 3, Name: "x", Wait: 90 * time.Second,
		Tags: []string{"a,b", "c"}, Pair: pair{4, 5}, Upper: upper{"A", "B"}}
	q := Query(want, All)
	var args []string
	for name, values := range q {
		for _, v := range values {
			args = append(args, "--"+name+"="+v)
		}
	}
	var got table
	err := runTable(t, Flags(table{}, All), args, func(c *cli.Context) error { return ReadInto(c, &got) })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip of %v:\n got %+v\nwant %+v", q, got, want)
	}
	if q := Query(table{}, All); len(q) != 0 {
		t.Errorf("the zero value renders %v, want nothing", q)
	}
}

func TestTableRead(t *testing.T) {
	defaults := table{Count: 7, Pair: pair{1, 2}}
	var got table
	err := runTable(t, Flags(defaults, All), []string{"-n", "y"}, func(c *cli.Context) error { return ReadInto(c, &got) })
	if err != nil || got.Count != 7 || got.Pair != (pair{1, 2}) || got.Name != "y" || got.Mode != "" {
		t.Errorf("defaults and alias: %+v, %v", got, err)
	}
	for args, want := range map[string]string{
		"--on --off":          "--on and --off exclude each other",
		"--pair=x":            `pair "x": give A:B`,
		"--upper=A --upper=b": `"b" is not upper case`,
	} {
		err := runTable(t, Flags(table{}, All), strings.Fields(args), func(c *cli.Context) error { return ReadInto(c, new(table)) })
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
	// A command without a flag leaves its field alone.
	got = table{Count: 9}
	err = runTable(t, Flags(table{}, Named("name")), []string{"--name", "z"}, func(c *cli.Context) error { return ReadInto(c, &got) })
	if err != nil || got.Count != 9 || got.Name != "z" {
		t.Errorf("a command with --name only: %+v, %v", got, err)
	}
}

func TestTableGivenHideNameOf(t *testing.T) {
	flags := Hide(Flags(table{}, All), table{}, InGroups("g"))
	for _, f := range flags {
		if hidden := !f.(cli.VisibleFlag).IsVisible(); hidden != slices.Contains([]string{"on", "off", "quiet"}, f.Names()[0]) {
			t.Errorf("--%s hidden %v", f.Names()[0], hidden)
		}
	}
	var given []string
	err := runTable(t, flags, []string{"--quiet", "--count=1"}, func(c *cli.Context) error {
		given = Given(c, table{}, InGroups("g"))
		return nil
	})
	if err != nil || !slices.Equal(given, []string{"quiet"}) {
		t.Errorf("given %v, %v", given, err)
	}
	var tb table
	if n := NameOf(&tb, &tb.Wait); n != "wait" {
		t.Errorf("NameOf(Wait) = %q", n)
	}
	if n := NameOf(&tb, &tb.Quiet); n != "quiet" {
		t.Errorf("NameOf(Quiet) = %q", n)
	}
}

func TestTableRefusesWhatItCannotServe(t *testing.T) {
	for _, v := range []any{
		struct {
			A int `flag:"a"`
			B int `flag:"a"`
		}{},
		struct {
			M map[string]int `flag:"m"`
		}{},
		struct {
			S int `flag:"x=1,y=2"`
		}{},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%T: no panic", v)
				}
			}()
			Fields(v)
		}()
	}
}
