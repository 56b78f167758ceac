// Package flagtable derives command-line flags, REST query parameters and
// their reading from flag tables: structs whose fields' tags name their
// flags (see Fields). forkopts.Fork is one, and so are the Podman client's
// options (shim/podmanfork); a flag is spelled and described once, in its
// field's tag.
package flagtable

import (
	"encoding"
	"fmt"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
)

// A flag table is a struct type whose fields say, in tags, which flag sets
// them. The command-line flags, a REST query's parameters and the reading
// of both are derived from the tags, so that a flag is spelled once:
//
//	flag:"NAME"          the field is --NAME
//	flag:"A=x,B=y"       a switch: boolean flags --A and --B, each setting
//	                     the field (a string type) to its value; they
//	                     exclude each other
//	alias:"p"            a short name
//	usage:"..."          the help (a switch's, one per flag, joined by " | ")
//	group:"capture"      the group a command may take or leave as a whole
//
// A field may be a bool, an int, a string or string type, a time.Duration,
// a []string (a repeated flag), a List (a repeated flag read by the type),
// or a type with text marshalling on its pointer (a flag read by the type).
// The fields of an embedded struct are the table's too.

// List is a field given by a repeated flag: its values, and (on its
// pointer) SetFlagValues, which reads them back.
type List interface {
	FlagValues() []string
}

// listSetter is a List's pointer.
type listSetter interface {
	SetFlagValues([]string) error
}

// Field is one flag of a table.
type Field struct {
	Name    string
	Aliases []string
	Usage   string
	Group   string
	// Choice is the value a switch's flag sets; empty for other flags.
	Choice string

	index []int
	kind  kind
}

type kind int

const (
	kindBool kind = iota
	kindInt
	kindString
	kindDuration
	kindStrings
	kindList
	kindText
	kindSwitch
)

var (
	durationType = reflect.TypeFor[time.Duration]()
	listType     = reflect.TypeFor[List]()
	setterType   = reflect.TypeFor[listSetter]()
	marshalType  = reflect.TypeFor[encoding.TextMarshaler]()
	unmarshType  = reflect.TypeFor[encoding.TextUnmarshaler]()
	tables       sync.Map // reflect.Type -> []Field
)

// Fields is the table of the struct type of v (a struct or a pointer to
// one). A tag the table cannot serve panics: it is a programming error,
// found by any test that builds the table.
func Fields(v any) []Field {
	t := reflect.TypeOf(v)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if fs, ok := tables.Load(t); ok {
		return fs.([]Field)
	}
	fs := fieldsOf(t, nil)
	seen := map[string]bool{}
	for _, f := range fs {
		for _, n := range append([]string{f.Name}, f.Aliases...) {
			if seen[n] {
				panic(fmt.Sprintf("flag table %s: --%s twice", t, n))
			}
			seen[n] = true
		}
	}
	tables.Store(t, fs)
	return fs
}

func fieldsOf(t reflect.Type, parent []int) []Field {
	var out []Field
	for i := range t.NumField() {
		sf := t.Field(i)
		index := append(append([]int(nil), parent...), i)
		tag, ok := sf.Tag.Lookup("flag")
		if !ok {
			if sf.Anonymous && sf.Type.Kind() == reflect.Struct {
				out = append(out, fieldsOf(sf.Type, index)...)
			}
			continue
		}
		base := Field{Group: sf.Tag.Get("group"), index: index}
		if a := sf.Tag.Get("alias"); a != "" {
			base.Aliases = strings.Split(a, ",")
		}
		if strings.Contains(tag, "=") {
			if sf.Type.Kind() != reflect.String {
				panic(fmt.Sprintf("flag table %s: switch %s on a %s", t, tag, sf.Type))
			}
			usages := strings.Split(sf.Tag.Get("usage"), " | ")
			for j, choice := range strings.Split(tag, ",") {
				name, value, _ := strings.Cut(choice, "=")
				f := base
				f.Name, f.Choice, f.kind = name, value, kindSwitch
				if j < len(usages) {
					f.Usage = usages[j]
				}
				out = append(out, f)
			}
			continue
		}
		f := base
		f.Name, f.Usage, f.kind = tag, sf.Tag.Get("usage"), kindOf(sf.Type)
		out = append(out, f)
	}
	return out
}

func kindOf(t reflect.Type) kind {
	p := reflect.PointerTo(t)
	switch {
	case t.Implements(listType) && p.Implements(setterType):
		return kindList
	case t.Implements(marshalType) && p.Implements(unmarshType):
		return kindText
	case t == durationType:
		return kindDuration
	}
	switch t.Kind() {
	case reflect.Bool:
		return kindBool
	case reflect.Int:
		return kindInt
	case reflect.String:
		return kindString
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			return kindStrings
		}
	}
	panic(fmt.Sprintf("flag table: a field of type %s cannot be a flag", t))
}

// Keep selects fields of a table.
type Keep func(Field) bool

// All keeps every field.
func All(Field) bool { return true }

// InGroups keeps the fields of the groups.
func InGroups(groups ...string) Keep {
	return func(f Field) bool {
		for _, g := range groups {
			if f.Group == g {
				return true
			}
		}
		return false
	}
}

// Named keeps the named fields.
func Named(names ...string) Keep {
	return func(f Field) bool {
		for _, n := range names {
			if f.Name == n {
				return true
			}
		}
		return false
	}
}

// Or keeps what any of keeps keeps.
func Or(keeps ...Keep) Keep {
	return func(f Field) bool {
		for _, k := range keeps {
			if k(f) {
				return true
			}
		}
		return false
	}
}

// Not keeps what keep does not.
func Not(keep Keep) Keep { return func(f Field) bool { return !keep(f) } }

// Flags are the command-line flags of the fields of defaults' table that
// keep keeps, in the table's order; each flag's default is defaults' field.
// Flags are made afresh for each command run: urfave/cli keeps values in
// them.
func Flags(defaults any, keep Keep) []cli.Flag {
	dv := reflect.Indirect(reflect.ValueOf(defaults))
	var out []cli.Flag
	for _, f := range Fields(defaults) {
		if !keep(f) {
			continue
		}
		v := dv.FieldByIndex(f.index)
		switch f.kind {
		case kindBool:
			out = append(out, &cli.BoolFlag{Name: f.Name, Aliases: f.Aliases, Usage: f.Usage, Value: v.Bool()})
		case kindSwitch:
			out = append(out, &cli.BoolFlag{Name: f.Name, Aliases: f.Aliases, Usage: f.Usage, Value: v.String() == f.Choice})
		case kindInt:
			out = append(out, &cli.IntFlag{Name: f.Name, Aliases: f.Aliases, Usage: f.Usage, Value: int(v.Int())})
		case kindString:
			out = append(out, &cli.StringFlag{Name: f.Name, Aliases: f.Aliases, Usage: f.Usage, Value: v.String()})
		case kindDuration:
			out = append(out, &cli.DurationFlag{Name: f.Name, Aliases: f.Aliases, Usage: f.Usage, Value: time.Duration(v.Int())})
		case kindText:
			text, err := v.Interface().(encoding.TextMarshaler).MarshalText()
			if err != nil {
				panic(fmt.Sprintf("flag table: default of --%s: %v", f.Name, err))
			}
			out = append(out, &cli.StringFlag{Name: f.Name, Aliases: f.Aliases, Usage: f.Usage, Value: string(text)})
		case kindStrings, kindList:
			out = append(out, &cli.StringSliceFlag{Name: f.Name, Aliases: f.Aliases, Usage: f.Usage})
		}
	}
	return out
}

// Hide hides the flags of fields keep keeps: a command that refuses them
// (see Given) still parses them, to say why.
func Hide(flags []cli.Flag, table any, keep Keep) []cli.Flag {
	hide := map[string]bool{}
	for _, f := range Fields(table) {
		if keep(f) {
			hide[f.Name] = true
		}
	}
	for _, fl := range flags {
		if !hide[fl.Names()[0]] {
			continue
		}
		switch fl := fl.(type) {
		case *cli.BoolFlag:
			fl.Hidden = true
		case *cli.IntFlag:
			fl.Hidden = true
		case *cli.StringFlag:
			fl.Hidden = true
		case *cli.DurationFlag:
			fl.Hidden = true
		case *cli.StringSliceFlag:
			fl.Hidden = true
		}
	}
	return flags
}

// Given names the fields keep keeps that were given on c's command line.
func Given(c *cli.Context, table any, keep Keep) []string {
	var out []string
	for _, f := range Fields(table) {
		if keep(f) && c.IsSet(f.Name) {
			out = append(out, f.Name)
		}
	}
	return out
}

// ReadInto fills the struct ptr points to from the flags of its table that c's
// command has, given or default; a field whose flag the command lacks is
// left as it is. A switch none of whose flags is given is left too.
func ReadInto(c *cli.Context, ptr any) error {
	pv := reflect.ValueOf(ptr).Elem()
	chosen := map[string][]string{} // switch field -> flags given
	for _, f := range Fields(ptr) {
		if c.Value(f.Name) == nil {
			continue // not a flag of this command
		}
		v := pv.FieldByIndex(f.index)
		switch f.kind {
		case kindBool:
			v.SetBool(c.Bool(f.Name))
		case kindSwitch:
			if c.Bool(f.Name) {
				key := fmt.Sprint(f.index)
				chosen[key] = append(chosen[key], "--"+f.Name)
				v.SetString(f.Choice)
			}
		case kindInt:
			v.SetInt(int64(c.Int(f.Name)))
		case kindString:
			v.SetString(c.String(f.Name))
		case kindDuration:
			v.SetInt(int64(c.Duration(f.Name)))
		case kindStrings:
			if s := c.StringSlice(f.Name); s != nil {
				v.Set(reflect.ValueOf(s))
			}
		case kindList:
			if err := v.Addr().Interface().(listSetter).SetFlagValues(c.StringSlice(f.Name)); err != nil {
				return fmt.Errorf("--%s: %w", f.Name, err)
			}
		case kindText:
			if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(c.String(f.Name))); err != nil {
				return fmt.Errorf("--%s: %w", f.Name, err)
			}
		}
	}
	for _, given := range chosen {
		if len(given) > 1 {
			return fmt.Errorf("%s exclude each other", strings.Join(given, " and "))
		}
	}
	return nil
}

// Query is the fields of v's table that keep keeps and that are not zero,
// as query parameters named as their flags: what ReadInto reads back from a
// command line of the same flags (see FromQuery).
func Query(v any, keep Keep) url.Values {
	rv := reflect.Indirect(reflect.ValueOf(v))
	q := url.Values{}
	for _, f := range Fields(v) {
		fv := rv.FieldByIndex(f.index)
		if !keep(f) || fv.IsZero() {
			continue
		}
		switch f.kind {
		case kindBool:
			q.Add(f.Name, "true")
		case kindSwitch:
			if fv.String() == f.Choice {
				q.Add(f.Name, "true")
			}
		case kindInt:
			q.Add(f.Name, strconv.FormatInt(fv.Int(), 10))
		case kindString:
			q.Add(f.Name, fv.String())
		case kindDuration:
			q.Add(f.Name, time.Duration(fv.Int()).String())
		case kindStrings:
			for _, s := range fv.Interface().([]string) {
				q.Add(f.Name, s)
			}
		case kindList:
			for _, s := range fv.Interface().(List).FlagValues() {
				q.Add(f.Name, s)
			}
		case kindText:
			if text, err := fv.Interface().(encoding.TextMarshaler).MarshalText(); err == nil {
				q.Add(f.Name, string(text))
			}
		}
	}
	return q
}

// NameOf is the flag of the field fieldPtr points to, in the struct
// structPtr points to: how a check names the flag it refuses.
func NameOf(structPtr, fieldPtr any) string {
	sv := reflect.ValueOf(structPtr).Elem()
	addr := reflect.ValueOf(fieldPtr).Pointer()
	for _, f := range Fields(structPtr) {
		if sv.FieldByIndex(f.index).Addr().Pointer() == addr && f.kind != kindSwitch {
			return f.Name
		}
	}
	panic(fmt.Sprintf("flag table %s: no flag for the field at %#x", sv.Type(), addr))
}
