package crun

// Args builds a crun argument vector: every caller renders flags in crun's
// spelling with it, so that a flag is written one way.
type Args []string

// Flag adds --name when on.
func (a *Args) Flag(name string, on bool) {
	if on {
		*a = append(*a, name)
	}
}

// Value adds --name value when value is set.
func (a *Args) Value(name, value string) {
	if value != "" {
		*a = append(*a, name, value)
	}
}

// Assign adds --name=value when value is set, the form crun's global
// options are given in.
func (a *Args) Assign(name, value string) {
	if value != "" {
		*a = append(*a, name+"="+value)
	}
}
