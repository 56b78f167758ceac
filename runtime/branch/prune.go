package branch

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// PruneRule says which branches prune removes. Of the branches it selects
// (all, or those of Source, or named with NamePrefix), it removes those
// that are not among the KeepLast newest of their source and are older
// than OlderThan (0: any age). A branch labelled KeepLabel=true is never
// removed.
type PruneRule struct {
	KeepLast   int
	OlderThan  time.Duration
	Source     string
	NamePrefix string
	// KeepLastSet makes KeepLast a rule: 0 then removes every selected
	// branch old enough.
	KeepLastSet bool
}

// KeepLabel marks a branch that prune never removes.
const KeepLabel = "io.tclone.keep"

// Pruned is one branch prune removes, and why.
type Pruned struct {
	Name   string    `json:"name"`
	ID     string    `json:"id"`
	Source string    `json:"source"`
	Since  time.Time `json:"created_at"`
	Why    string    `json:"why"`
}

// PrunePlan is what prune removes and the disk bytes that frees.
type PrunePlan struct {
	Remove []Pruned `json:"remove"`
	// Kept are the selected branches kept only for their keep label.
	Kept  []string `json:"kept_by_label,omitempty"`
	Bytes int64    `json:"bytes"`
}

// Prune works out what rule removes, now, and removes it when remove is
// set; else it only says.
func (s Store) Prune(rule PruneRule, now time.Time, remove bool) (*PrunePlan, error) {
	if !rule.KeepLastSet && rule.OlderThan <= 0 {
		return nil, errors.New("say what to prune: give --keep-last N, --older-than DURATION, or both")
	}
	if rule.KeepLastSet && rule.KeepLast < 0 {
		return nil, fmt.Errorf("--keep-last %d: give how many of the newest branches of each source to keep, 0 or more", rule.KeepLast)
	}
	infos, err := s.list(false)
	if err != nil {
		return nil, err
	}
	bySource := map[string][]*Branch{}
	for _, in := range infos {
		b := in.Branch
		if !b.Source.Is(rule.Source) {
			continue
		}
		if !strings.HasPrefix(b.Name, rule.NamePrefix) {
			continue
		}
		bySource[b.Source.ID] = append(bySource[b.Source.ID], b)
	}
	out := &PrunePlan{Remove: []Pruned{}}
	var ids []string
	for _, branches := range bySource {
		// Newest first.
		sort.Slice(branches, func(i, j int) bool { return branches[i].CreatedAt.After(branches[j].CreatedAt) })
		for i, b := range branches {
			var why []string
			if rule.KeepLastSet {
				if i < rule.KeepLast {
					continue
				}
				why = append(why, fmt.Sprintf("not among the %d newest of %s", rule.KeepLast, b.Source.Name))
			}
			if rule.OlderThan > 0 {
				age := now.Sub(b.CreatedAt)
				if age <= rule.OlderThan {
					continue
				}
				why = append(why, fmt.Sprintf("older than %s (%s)", rule.OlderThan, age.Round(time.Second)))
			}
			if b.Labels[KeepLabel] == "true" {
				out.Kept = append(out.Kept, b.Name)
				continue
			}
			out.Remove = append(out.Remove, Pruned{Name: b.Name, ID: b.ID, Source: b.Source.Name, Since: b.CreatedAt, Why: strings.Join(why, ", ")})
			ids = append(ids, b.ID)
		}
	}
	sort.Slice(out.Remove, func(i, j int) bool {
		a, b := out.Remove[i], out.Remove[j]
		return a.Since.Before(b.Since) || (a.Since.Equal(b.Since) && a.Name < b.Name)
	})
	sort.Strings(out.Kept)
	out.Bytes = s.freedBy(infos, ids)
	if remove && len(ids) > 0 {
		if _, err := s.Remove(ids...); err != nil {
			return out, err
		}
	}
	return out, nil
}

// freedBy is the disk bytes removing branches ids would free: their trees,
// and the chunks no other branch uses.
func (s Store) freedBy(all []Info, ids []string) int64 {
	gone := map[string]bool{}
	for _, id := range ids {
		gone[id] = true
	}
	kept := map[string]bool{}
	for _, in := range all {
		if gone[in.ID] {
			continue
		}
		for _, f := range in.Files {
			for _, c := range f.Chunks {
				kept[c.Hash] = true
			}
		}
	}
	var bytes int64
	counted := map[string]bool{}
	for _, in := range all {
		if !gone[in.ID] {
			continue
		}
		bytes += treeSize(s.dirOf(in.ID))
		for _, f := range in.Files {
			for _, c := range f.Chunks {
				if !kept[c.Hash] && !counted[c.Hash] {
					counted[c.Hash] = true
					bytes += s.chunks().storedSize(c.Hash)
				}
			}
		}
	}
	return bytes
}
