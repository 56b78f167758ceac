package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
)

// The module calls internal kernel functions, found by name, with the
// prototypes listed in kernel/vma_cherrypick/vcp_syms.h. The build checks
// those against the kernel headers where the headers declare them; this
// checks every one against the running kernel's own type information (BTF),
// which also covers the functions only mm/internal.h declares.

const (
	btfKindInt       = 1
	btfKindPtr       = 2
	btfKindArray     = 3
	btfKindStruct    = 4
	btfKindUnion     = 5
	btfKindEnum      = 6
	btfKindFwd       = 7
	btfKindTypedef   = 8
	btfKindVolatile  = 9
	btfKindConst     = 10
	btfKindRestrict  = 11
	btfKindFunc      = 12
	btfKindFuncProto = 13
	btfKindVar       = 14
	btfKindDatasec   = 15
	btfKindFloat     = 16
	btfKindDeclTag   = 17
	btfKindTypeTag   = 18
	btfKindEnum64    = 19
)

type btfType struct {
	name     string
	kind     int
	kindFlag bool
	ref      uint32   // size_or_type: the referenced type for PTR, CONST, TYPEDEF, FUNC, FUNC_PROTO
	params   []uint32 // FUNC_PROTO parameter types
}

type btfInfo struct {
	types []btfType // index = type id; 0 is void
	funcs map[string]uint32
}

func loadBTF(path string) (*btfInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	if len(b) < 24 || le.Uint16(b) != 0xeB9F {
		return nil, fmt.Errorf("%s is not BTF", path)
	}
	hdr := le.Uint32(b[4:])
	typeOff, typeLen := hdr+le.Uint32(b[8:]), le.Uint32(b[12:])
	strOff, strLen := hdr+le.Uint32(b[16:]), le.Uint32(b[20:])
	strs := b[strOff : strOff+strLen]
	str := func(off uint32) string {
		end := off
		for end < uint32(len(strs)) && strs[end] != 0 {
			end++
		}
		return string(strs[off:end])
	}
	info := &btfInfo{types: []btfType{{name: "void"}}, funcs: map[string]uint32{}}
	data := b[typeOff : typeOff+typeLen]
	for p := 0; p+12 <= len(data); {
		word := le.Uint32(data[p+4:])
		t := btfType{name: str(le.Uint32(data[p:])), kind: int(word>>24) & 0x1f, kindFlag: word>>31 == 1, ref: le.Uint32(data[p+8:])}
		vlen := int(word & 0xffff)
		p += 12
		switch t.kind {
		case btfKindInt, btfKindVar, btfKindDeclTag:
			p += 4
		case btfKindArray:
			p += 12
		case btfKindStruct, btfKindUnion, btfKindDatasec, btfKindEnum64:
			p += 12 * vlen
		case btfKindEnum:
			p += 8 * vlen
		case btfKindFuncProto:
			for i := 0; i < vlen; i++ {
				t.params = append(t.params, le.Uint32(data[p+8*i+4:]))
			}
			p += 8 * vlen
		}
		if t.kind == btfKindFunc {
			info.funcs[t.name] = uint32(len(info.types))
		}
		info.types = append(info.types, t)
	}
	return info, nil
}

// cName spells a type the way a C declaration does, as the module's
// prototype strings do.
func (bi *btfInfo) cName(id uint32) string {
	if id == 0 || int(id) >= len(bi.types) {
		return "void"
	}
	t := bi.types[id]
	switch t.kind {
	case btfKindInt, btfKindFloat, btfKindTypedef:
		return normalizeInt(t.name)
	case btfKindPtr:
		return bi.cName(t.ref) + " *"
	case btfKindConst:
		return "const " + bi.cName(t.ref)
	case btfKindVolatile:
		return "volatile " + bi.cName(t.ref)
	case btfKindRestrict, btfKindTypeTag:
		return bi.cName(t.ref)
	case btfKindStruct:
		return "struct " + t.name
	case btfKindUnion:
		return "union " + t.name
	case btfKindFwd:
		if t.kindFlag {
			return "union " + t.name
		}
		return "struct " + t.name
	case btfKindEnum, btfKindEnum64:
		return "enum " + t.name
	}
	return fmt.Sprintf("<kind %d %s>", t.kind, t.name)
}

// normalizeInt turns DWARF's base type names into the usual C spelling.
func normalizeInt(name string) string {
	switch name {
	case "long unsigned int":
		return "unsigned long"
	case "long int":
		return "long"
	case "long long unsigned int":
		return "unsigned long long"
	case "long long int":
		return "long long"
	case "short unsigned int":
		return "unsigned short"
	case "_Bool":
		return "bool"
	}
	return name
}

// prototype is "ret name(param, ...)" for a kernel function.
func (bi *btfInfo) prototype(name string) (string, error) {
	id, ok := bi.funcs[name]
	if !ok {
		return "", fmt.Errorf("the kernel's BTF has no function %s", name)
	}
	proto := bi.types[bi.types[id].ref]
	params := make([]string, len(proto.params))
	for i, p := range proto.params {
		params[i] = bi.cName(p)
	}
	return bi.cName(proto.ref) + " " + name + "(" + strings.Join(params, ", ") + ")", nil
}

// normalizeProto collapses spacing so that "struct x *" and "struct x*" agree.
func normalizeProto(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	s = strings.ReplaceAll(s, " *", "*")
	return strings.ReplaceAll(s, "*", " *")
}

func testPrototypes(s *suite) error {
	want, err := os.ReadFile("/sys/module/vma_cherrypick/parameters/prototypes")
	if err != nil {
		return err
	}
	bi, err := loadBTF("/sys/kernel/btf/vmlinux")
	if err != nil {
		return err
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(want)), "\n") {
		open := strings.IndexByte(line, '(')
		fields := strings.Fields(line[:open])
		name := fields[len(fields)-1]
		got, err := bi.prototype(name)
		if err != nil {
			return err
		}
		if normalizeProto(got) != normalizeProto(line) {
			return fmt.Errorf("the module calls %q, the running kernel declares %q", line, got)
		}
		n++
	}
	fmt.Printf("  prototypes: %d functions called through kallsyms match the kernel's BTF\n", n)
	return nil
}
