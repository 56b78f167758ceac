package podmanflags

import (
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/tclone/tclone/runtime/forkopts"
	"github.com/tclone/tclone/shim/flagtable"
	"github.com/tclone/tclone/shim/podmanfork"
)

// query is what the client sends for o.
func query(o podmanfork.Options) url.Values { return flagtable.Query(o, podmanfork.ForkQuery) }

// What a client sends (its query of Options) is what the service reads back.
func TestQueryRoundTrip(t *testing.T) {
	for _, o := range []podmanfork.Options{
		{},
		{Count: 3, Names: []string{"a", "b", "c"}, Parallel: 2, Publish: []string{"80", "9000/udp"},
			IgnoreStaticIP: true, IgnoreStaticMAC: true,
			Labels:       map[string]string{"task": "42", "path": "a,b=c"},
			Hooks:        []string{"echo a, b", "true"},
			Ready:        podmanfork.Ready{Kind: podmanfork.ReadyHTTP, Port: 8080, Path: "/health?x=1"},
			ReadyTimeout: 90 * time.Second, WaitMemory: true,
			VolumeModes: podmanfork.VolumeModes{Default: podmanfork.VolumeShare,
				ByName: map[string]podmanfork.VolumeMode{"db": podmanfork.VolumeCopy}},
			Fork: forkopts.Fork{Capture: forkopts.Capture{TCP: forkopts.TCPClose, FileLocks: true, ExtUnixSk: true, ShellJob: true},
				Identity: forkopts.IdentityBestEffort, Memory: forkopts.Memory("copy"), CaptureTimeout: 30 * time.Second}},
		{Count: 1, Names: []string{"one"}, Fork: forkopts.Fork{FilesOnly: true}},
	} {
		got, err := FromQuery(query(o))
		if err != nil {
			t.Fatalf("%v: %v", query(o), err)
		}
		want := o
		// Unset values come back as the command's defaults.
		if want.Count == 0 {
			want.Count = 1
		}
		if want.Ready.Kind == "" {
			want.Ready.Kind = podmanfork.ReadyRunning
		}
		if want.ReadyTimeout == 0 {
			want.ReadyTimeout = podmanfork.DefaultReadyTimeout
		}
		if want.Identity == "" {
			want.Identity = forkopts.IdentityUnique
		}
		if want.CaptureTimeout == 0 {
			want.CaptureTimeout = forkopts.DefaultCaptureTimeout
		}
		if want.Labels == nil {
			want.Labels = map[string]string{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("round trip of %v:\n got %+v\nwant %+v", query(o), got, want)
		}
	}
}

func TestFromQuerySpellingsAndRefusals(t *testing.T) {
	q := url.Values{"readyTimeout": {"5s"}, "ignoreStaticIP": {"true"}, "volume_mode": {"share"}, "p": {"80"}, "count": {"2"}, "name": {"w"}}
	o, err := FromQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	if o.ReadyTimeout != 5*time.Second || !o.IgnoreStaticIP || o.VolumeModes.Default != podmanfork.VolumeShare ||
		len(o.Publish) != 1 || !reflect.DeepEqual(o.Names, []string{"w-1", "w-2"}) {
		t.Errorf("camel case and aliases were not read: %+v", o)
	}
	for _, c := range []struct {
		q    url.Values
		want string
	}{
		{url.Values{"count": {"0"}}, "--count 0: out of range"},
		{url.Values{"count": {"many"}}, "count"},
		{url.Values{"colour": {"red"}}, `unknown query parameter "colour"`},
		{url.Values{"readyTimeout": {"-1s"}}, "--ready-timeout"},
		{url.Values{"ready": {"soon"}}, "invalid readiness"},
		{url.Values{"label": {"novalue"}}, "KEY=VALUE"},
		{url.Values{"name": {"a b"}}, "--name"},
		{url.Values{"name": {"a", "b"}, "count": {"3"}}, "2 names for 3 siblings"},
		{url.Values{"filesOnly": {"yes"}}, "files-only"},
		{url.Values{"tcpEstablished": {"true"}, "tcpClose": {"true"}}, "tcp"},
	} {
		_, err := FromQuery(c.q)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.q, err, c.want)
		}
	}
}

// The help of --count and --parallel states the bound the options check.
func TestHelpStatesMaxCount(t *testing.T) {
	for _, f := range PodmanFork() {
		switch name := f.Names()[0]; name {
		case "count", "parallel":
			if u := f.(cli.DocGenerationFlag).GetUsage(); !strings.Contains(u, fmt.Sprintf("1..%d", podmanfork.MaxCount)) {
				t.Errorf("--%s's help does not say 1..%d: %q", name, podmanfork.MaxCount, u)
			}
		}
	}
}
