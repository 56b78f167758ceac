package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// BranchImage is one branch written as a checkpoint image and carried
// through a registry: `podman container branch export --image`, podman
// push, podman pull (the local copy removed first), and `podman container
// branch import --image` of the pulled image.
type BranchImage struct {
	Branch string `json:"branch"`
	// Parent is the image a delta was written over ("" for a full one).
	Parent string `json:"parent,omitempty"`
	// LayerMiB is the image's own layer, uncompressed; PushedMiB what the
	// push added to the registry's storage (compressed, shared blobs
	// counted once).
	LayerMiB  float64 `json:"layer_mib"`
	PushedMiB float64 `json:"pushed_mib"`
	ExportMs  float64 `json:"export_ms"`
	PushMs    float64 `json:"push_ms"`
	PullMs    float64 `json:"pull_ms"`
	ImportMs  float64 `json:"import_ms"`
}

// runBranchImages carries branches (of the successive ones: DirtyMiB
// apart) through a registry of the run's own (Debian's docker-registry on a
// free loopback port, its storage removed afterwards): the first as a full
// checkpoint image, each later one as a delta over it (--parent-image),
// which this host keeps, as one that exports successive branches does.
func (b *Bench) runBranchImages(ctx context.Context, workload string, branches []string) []*BranchImage {
	fail := func(what string, err error) { b.fail(workload, "checkpoint image "+what, -1, err) }
	dir, err := os.MkdirTemp("/var/lib/tclone", "tcb-registry-")
	if err != nil {
		fail("registry", err)
		return nil
	}
	defer os.RemoveAll(dir)
	addr, stop, err := startRegistry(dir)
	if err != nil {
		fail("registry", err)
		return nil
	}
	defer stop()
	var out []*BranchImage
	parent := ""
	for _, name := range branches {
		if ctx.Err() != nil {
			break
		}
		ref := fmt.Sprintf("%s/tcb-%s-image:%s", addr, b.runID, name)
		// Children first: Podman keeps a parent image its children use.
		defer b.tools.podman(context.Background(), "rmi", "-f", "--ignore", ref)
		im, err := b.carryImage(ctx, ref, parent, filepath.Join(dir, "root"), name)
		if err != nil {
			fail(name, err)
			break
		}
		out = append(out, im)
		if parent == "" {
			parent = ref
		}
	}
	return out
}

// carryImage carries branch name as image ref (a delta over parent, if
// set) through the registry whose storage is storage.
func (b *Bench) carryImage(ctx context.Context, ref, parent, storage, name string) (*BranchImage, error) {
	im := &BranchImage{Branch: name, Parent: parent}
	args := []string{"--url", b.svc.url, "export", "--image", ref, "--format", "json"}
	if parent != "" {
		args = append(args, "--parent-image", parent)
	}
	out, d, err := runCmd(ctx, b.podmanBranch(), append(args, name)...)
	if err != nil {
		return nil, err
	}
	var x struct {
		Bytes int64 `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(out), &x); err != nil || x.Bytes <= 0 {
		return nil, fmt.Errorf("decoding export --image's output: %v: %s", err, tail(out, 300))
	}
	im.LayerMiB, im.ExportMs = float64(x.Bytes)/(1<<20), ms(d)
	before := diskBytes(storage)
	if _, d, err = b.tools.podman(ctx, "push", "--tls-verify=false", ref); err != nil {
		return nil, err
	}
	im.PushMs, im.PushedMiB = ms(d), float64(diskBytes(storage)-before)/(1<<20)
	if _, _, err := b.tools.podman(ctx, "rmi", ref); err != nil {
		return nil, err
	}
	if _, d, err = b.tools.podman(ctx, "pull", "-q", "--tls-verify=false", ref); err != nil {
		return nil, err
	}
	im.PullMs = ms(d)
	imported := name + "-imported"
	if _, d, err = runCmd(ctx, b.podmanBranch(), "--url", b.svc.url, "import", "--image", ref, "--name", imported); err != nil {
		return nil, err
	}
	im.ImportMs = ms(d)
	if _, _, err := runCmd(ctx, b.podmanBranch(), "rm", imported); err != nil {
		return nil, err
	}
	return im, nil
}

// startRegistry runs docker-registry with its storage under dir, on a free
// loopback port, and returns its address and how to stop it.
func startRegistry(dir string) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	conf := filepath.Join(dir, "config.yml")
	config := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "root"), addr)
	if err := os.WriteFile(conf, []byte(config), 0o600); err != nil {
		return "", nil, err
	}
	cmd := exec.Command("docker-registry", "serve", conf)
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return "", nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", nil, fmt.Errorf("starting docker-registry (hack/setup-host.sh installs it): %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	stop := func() { cmd.Process.Kill(); <-exited }
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			return "", nil, fmt.Errorf("docker-registry exited: %s", tail(string(log), 500))
		default:
		}
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addr, stop, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("docker-registry did not answer at %s within 30 s", addr)
		}
	}
}

// writeBranchImages writes the checkpoint images' table through p.
func writeBranchImages(br *BranchResult, p func(string, ...any)) {
	if len(br.Images) == 0 {
		return
	}
	p("Branches as checkpoint images (`podman container branch export --image`, Podman's layout), pushed to a local registry (Debian's docker-registry, plain HTTP on loopback), pulled again after the local copy was removed, and imported as branches (`branch import --image`), one call each. The second branch is the first's successor, %d MiB of memory rewritten, written as a delta over the first image (`--parent-image`: one layer of what changed over the first's):\n\n| branch | layer (MiB) | pushed to the registry (MiB) | export | push | pull | import |\n| :-- | ---: | ---: | ---: | ---: | ---: | ---: |\n", br.DirtyMiB)
	for _, im := range br.Images {
		p("| %s | %s | %s | %s | %s | %s | %s |\n", im.Branch, fmtNum(im.LayerMiB), fmtNum(im.PushedMiB), fmtMs(im.ExportMs), fmtMs(im.PushMs), fmtMs(im.PullMs), fmtMs(im.ImportMs))
	}
	p("\n")
}

// imageTarget is issue 32's bound on what a second branch's image adds
// to a registry: ≤ 1.3 times one branch's bytes for the two.
func imageTarget(r *Results, exact bool) Target {
	br := r.Branches
	t := Target{Key: "image_two_pushed_over_one", Bound: 1.3, BoundText: "≤ 1.3",
		Title: fmt.Sprintf("registry bytes of two successive branches' checkpoint images / one, %s source changing ≤ 20 MiB between them", sizeText(br.MemMiB)), Value: math.NaN()}
	if len(br.Images) == 2 && br.Images[0].PushedMiB > 0 {
		t.Value = (br.Images[0].PushedMiB + br.Images[1].PushedMiB) / br.Images[0].PushedMiB
		t.Detail = fmt.Sprintf("%s + %s MiB pushed; the second image is a layer of what changed over the first (--parent-image)", fmtNum(br.Images[0].PushedMiB), fmtNum(br.Images[1].PushedMiB))
	}
	judge(&t, exact && br.DirtyMiB <= 20)
	return t
}
