package main

import (
	"fmt"
	"math"
)

// writeForkModes writes the sections on named volumes, files-only forks,
// --memory ksm and tclone's API service through p.
func writeForkModes(r *Results, p func(string, ...any)) {
	if vr := r.Volumes; vr != nil {
		p("## Named volumes\n\nSource: %s. `podman container fork --memory copy --print-stats --volume-mode MODE`, one cold fork and %d warm ones per variant; milliseconds, warm median (p95). *share*: the sibling mounts the source's volume. *copy*: tclone copies the volume inside the source's pause into its snapshot store, on the host's own filesystem. *reflink*: the same copy with the volume and the snapshot store on one XFS filesystem (a loop device), so the copy shares extents instead of copying them. The data was just written, so a copy reads it from the page cache.\n\n",
			vr.Workload, r.Config.VolumeReps)
		p("| variant | filesystem | --volume-mode | source pause | copy, in the pause | copied MiB | reflinked MiB | to running | checkpoint call | restore call |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, v := range vr.Variants {
			if v.NotMeasured != "" {
				p("| %s | %s | %s | not measured: %s | | | | | | |\n", v.Name, v.Filesystem, v.Mode, mdEscape(v.NotMeasured))
				continue
			}
			mr := &MethodResult{Warm: v.Summary}
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", v.Name, v.Filesystem, v.Mode, cell(mr, "pause_ms"), cell(mr, "copy_ms"),
				fmtNum(mr.warmMedian("copied_mib")), fmtNum(mr.warmMedian("reflinked_mib")), cell(mr, "to_running_ms"), cell(mr, "checkpoint_ms"), cell(mr, "restore_ms"))
		}
		p("\nThe checkpoint call is long in every variant, share included: Podman's checkpoint archives every named volume into its export after the source runs on, and its REST API has no option to leave them out. The source pause is not affected.\n\n")
	}
	if fr := r.FilesOnly; fr != nil {
		p("## Files-only forks\n\n`podman container fork --files-only --print-stats`: the root filesystem is captured while the source's processes are held still; the sibling is a new container from the same image and configuration that runs its command from the start. One cold fork and %d warm ones per source; milliseconds, warm median (p95).\n\n", r.Config.WarmReps)
		p("| source | source pause | fs snapshot | to running | checkpoint call | restore call |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
		for _, s := range fr.Sources {
			mr := &MethodResult{Warm: s.Summary}
			p("| `%s`: %s | %s | %s | %s | %s | %s |\n", s.Workload, s.Description, cell(mr, "pause_ms"), cell(mr, "fs_snapshot_ms"), cell(mr, "to_running_ms"), cell(mr, "checkpoint_ms"), cell(mr, "restore_ms"))
		}
		p("\n")
	}
	if kr := r.KSM; kr != nil {
		p("## --memory ksm\n\nSource: %s. `podman container fork --memory ksm --print-stats` (source pause %s ms), then both were read every few seconds for %.0f s. No kernel module: ksmd merges the identical pages of source and sibling, which tclone marks mergeable from their first instruction and for which it turns ksmd up while the fork is young. ", kr.Workload, fmtMs(kr.PauseMs), r.Config.KSMWindowS)
		p("ksmd's settings before the run: %v; put back after the fork was removed and `tclone gc` ran: %v. *ksmd CPU* is its CPU time since the fork returned over the time elapsed, in one CPU.\n\n", kr.Host, kr.Restored)
		p("| after (s) | sibling RSS (MiB) | sibling PSS (MiB) | sibling PSS / RSS | source PSS (MiB) | pages_sharing | ksmd CPU |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, pt := range kr.Points {
			p("| %.1f | %s | %s | %.2f | %s | %d | %.0f%% |\n", pt.AtS, fmtMiB(float64(pt.Sibling.RssKiB)), fmtMiB(float64(pt.Sibling.PssKiB)),
				ratioOf(pt.Sibling.PssKiB, pt.Sibling.RssKiB), fmtMiB(float64(pt.Source.PssKiB)), pt.PagesSharing, 100*pt.KsmdCPU)
		}
		if kr.ReachedS >= 0 {
			p("\nThe sibling's PSS was at most 0.6 of its RSS %.0f s after the fork.\n\n", kr.ReachedS)
		} else {
			p("\nThe sibling's PSS never fell to 0.6 of its RSS in the window.\n\n")
		}
	}
	if pr := r.Proxy; pr != nil {
		p("## REST proxy\n\n`tclone service` in front of the benchmark's Podman service: each request was sent to Podman's socket and to tclone's in turn (alternating which went first), on kept-alive connections, after 3 unmeasured rounds; %d rounds for the list, a quarter of that for exec. Milliseconds, median (p95); *added* is the median of the paired differences.\n\n", pr.Reps)
		p("| request | Podman's socket | tclone's socket | added |\n| --- | ---: | ---: | ---: |\n")
		for _, q := range pr.Requests {
			p("| %s | %s (%s) | %s (%s) | %s |\n", q.Name, fmtMs(q.Podman.Median), fmtMs(q.Podman.P95), fmtMs(q.Tclone.Median), fmtMs(q.Tclone.P95), fmtMs(q.AddedMs))
		}
		p("\n")
	}
}

func ratioOf(num, den int64) float64 {
	if den <= 0 {
		return math.NaN()
	}
	return float64(num) / float64(den)
}

// forkModeTargets are the named-volume and KSM targets.
func forkModeTargets(r *Results) []Target {
	var out []Target
	if vr := r.Volumes; vr != nil {
		// Within the noise a copy by reflink can add less than nothing.
		t := Target{Key: "volume_reflink_added_pause_ms", Bound: 50, BoundText: "≤ 50 ms", Difference: true,
			Title: fmt.Sprintf("source pause added by a named volume of %s copied by reflink, ms (reflink − share)", sizeText(vr.SizeMiB)), Value: math.NaN()}
		share, reflink := volumeVariant(vr, "share"), volumeVariant(vr, "reflink")
		if share != nil && reflink != nil {
			s, f := (&MethodResult{Warm: share.Summary}).warmMedian("pause_ms"), (&MethodResult{Warm: reflink.Summary}).warmMedian("pause_ms")
			t.Value = f - s
			t.Detail = fmt.Sprintf("pause %s ms with reflink, %s ms shared", fmtMs(f), fmtMs(s))
			if copyV := volumeVariant(vr, "copy"); copyV != nil {
				t.Detail += fmt.Sprintf(", %s ms copied without reflinks", fmtMs((&MethodResult{Warm: copyV.Summary}).warmMedian("pause_ms")))
			}
		}
		judge(&t, vr.SizeMiB == 1024)
		out = append(out, t)
	}
	if kr := r.KSM; kr != nil {
		t := Target{Key: "ksm_sibling_pss_over_rss_60s", Bound: 0.6, BoundText: "≤ 0.6 within 60 s",
			Title: fmt.Sprintf("--memory ksm, idle %s source: sibling PSS / RSS, lowest within 60 s", sizeText(kr.MemMiB)), Value: math.NaN()}
		for _, pt := range kr.Points {
			if pt.AtS > 60 {
				break
			}
			if v := ratioOf(pt.Sibling.PssKiB, pt.Sibling.RssKiB); math.IsNaN(t.Value) || v < t.Value {
				t.Value = v
				t.Detail = fmt.Sprintf("after %.0f s: PSS %s MiB of RSS %s MiB; ksmd used %.0f%% of a CPU until then", pt.AtS,
					fmtMiB(float64(pt.Sibling.PssKiB)), fmtMiB(float64(pt.Sibling.RssKiB)), 100*pt.KsmdCPU)
			}
		}
		if kr.ReachedS >= 0 {
			t.Detail += fmt.Sprintf("; first at most 0.6 after %.0f s", kr.ReachedS)
		}
		judge(&t, kr.MemMiB == 1024 && r.Config.KSMWindowS >= 60)
		out = append(out, t)
	}
	if pr := r.Proxy; pr != nil {
		for i, key := range proxyTargetKeys {
			t := Target{Key: key, Bound: 2, BoundText: "≤ 2 ms", Difference: true,
				Title: "latency tclone's API service adds to " + proxyRequests[i] + ", ms (median of paired differences)", Value: math.NaN()}
			for _, q := range pr.Requests {
				if q.Name == proxyRequests[i] && q.Tclone.N > 0 {
					t.Value = q.AddedMs
					t.Detail = fmt.Sprintf("%s ms through tclone's socket, %s ms through Podman's, %d rounds", fmtMs(q.Tclone.Median), fmtMs(q.Podman.Median), q.Tclone.N)
				}
			}
			judge(&t, !r.Quick)
			out = append(out, t)
		}
	}
	return out
}

// proxyTargetKeys are the targets of proxyRequests, in their order.
var proxyTargetKeys = []string{"rest_proxy_added_ms_list", "rest_proxy_added_ms_exec"}

func volumeVariant(vr *VolumeResult, name string) *VolumeVariant {
	for _, v := range vr.Variants {
		if v.Name == name && v.NotMeasured == "" && len(v.Summary) > 0 {
			return v
		}
	}
	return nil
}
