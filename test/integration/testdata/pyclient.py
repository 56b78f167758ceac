"""A REST client of tclone's API service, in podman-py (python3-podman).

Usage: pyclient.py SOCKET SOURCE. Podman's ordinary calls go through the
service as they would to Podman's own; the fork goes through the raw API
client. Prints one JSON object with what it saw.
"""
import json
import sys

from podman import PodmanClient

socket, source = sys.argv[1], sys.argv[2]
out = {}
with PodmanClient(base_url="unix://" + socket) as client:
    out["ping"] = client.ping()
    out["version"] = client.version()["Version"]
    out["names"] = sorted(c.name for c in client.containers.list())
    ctr = client.containers.get(source)
    out["status"] = ctr.status
    code, (stdout, _) = ctr.exec_run(["/bin/sh", "-c", "echo exec-ok"], demux=True)
    out["exec"] = [code, stdout.decode().strip()]
    resp = client.api.post(
        "/containers/%s/fork" % source,
        params={"count": 2, "label": "via=python", "readyTimeout": "60s"},
    )
    out["fork_status"] = resp.status_code
    out["fork"] = resp.json()
    resp = client.api.post("/containers/tct-no-such-container/fork")
    out["missing_status"] = resp.status_code
    out["missing"] = resp.json()
    for sib in out["fork"]["siblings"]:
        c = client.containers.get(sib["id"])
        out.setdefault("siblings", []).append({"name": c.name, "status": c.status, "labels": c.labels})
print(json.dumps(out))
