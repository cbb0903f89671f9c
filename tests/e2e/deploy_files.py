"""The deploy/ files as installed: `meson install` puts the binaries, the
systemd unit (with this prefix's paths), the example config, the nginx and
Kubernetes examples, the docs and the man pages (or --help text) in place;
the installed unit passes `systemd-analyze verify`; the Kubernetes
manifests pass kubernetes-validate's schema check (and a broken one fails).
Collected by the deploy_pytest meson test.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

SRC = os.environ.get("DSQ_SOURCE_ROOT", "")
BUILD = os.environ.get("DSQ_BUILD_ROOT", "")


@pytest.fixture(scope="module")
def destdir(tmp_path_factory):
    if not BUILD or not os.path.isdir(BUILD):
        pytest.fail(f"DSQ_BUILD_ROOT does not name the build dir (got {BUILD!r})")
    d = tmp_path_factory.mktemp("destdir")
    r = subprocess.run(["meson", "install", "-C", BUILD, "--no-rebuild", "--quiet",
                        "--destdir", str(d)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    prefix = subprocess.run(["meson", "introspect", BUILD, "--buildoptions"],
                            capture_output=True, text=True, check=True).stdout
    import json
    opts = {o["name"]: o["value"] for o in json.loads(prefix)}
    return d, opts


def rooted(d, path):
    return os.path.join(str(d), path.lstrip("/"))


def test_meson_install_layout(destdir):
    d, opts = destdir
    pre = opts["prefix"]
    bindir = os.path.join(pre, opts["bindir"])
    sysconf = os.path.join(pre, opts["sysconfdir"])
    for exe in ("dsqd", "dsq-run", "dsq-inspect", "dsq-tokenize", "dsq-bench",
                "dsq-quantize", "dsq-perplexity"):
        p = rooted(d, os.path.join(bindir, exe))
        assert os.access(p, os.X_OK), f"not installed: {p}"
    unit = rooted(d, os.path.join(pre, "lib/systemd/system/dsqd.service"))
    text = open(unit).read()
    assert "@" not in re.sub(r"#.*", "", text), "unsubstituted @VAR@ in the unit"
    exec_start = re.search(r"^ExecStart=(.*)$", text, re.M).group(1)
    assert exec_start == f"{bindir}/dsqd --config {sysconf}/dsqd/dsqd.json", exec_start
    for key in ("Type=notify", "Restart=on-failure", "ProtectSystem=strict",
                "ProtectHome=yes", "PrivateTmp=yes", "NoNewPrivileges=yes",
                "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX", "WatchdogSec=",
                f"EnvironmentFile=-{sysconf}/dsqd/env", "ReadOnlyPaths=",
                "DeviceAllow=/dev/nvidiactl"):
        assert key in text, f"unit lacks {key}"
    doc = rooted(d, os.path.join(pre, opts["datadir"], "doc/dsq"))
    for f in ("examples/dsqd.json", "examples/dsqd.env", "examples/nginx/dsq.conf",
              "examples/kubernetes/deployment.yaml", "examples/kubernetes/service.yaml",
              "examples/kubernetes/pdb.yaml", "examples/kubernetes/configmap.yaml",
              "deploy.md", "scaling.md"):
        assert os.path.isfile(os.path.join(doc, f)), f"not installed: {doc}/{f}"
    man = rooted(d, os.path.join(pre, opts["mandir"], "man1/dsqd.1"))
    helptxt = os.path.join(doc, "dsqd.help.txt")
    assert os.path.isfile(man) or os.path.isfile(helptxt), "neither man page nor --help text"
    if os.path.isfile(man):
        assert "--kv-cache-memory" in open(man).read().replace("\\-", "-")


def verify_unit(sa, unit_text, tmp_path):
    """systemd-analyze verify on unit_text saved as dsqd.service: (rc, lines
    naming our unit). verify exits 0 on unknown keys and bad values (it only
    logs them), so every line about dsqd.service counts as a failure."""
    p = tmp_path / "dsqd.service"
    p.write_text(unit_text)
    r = subprocess.run([sa, "verify", "--man=no", str(p)], capture_output=True, text=True)
    out = r.stdout + r.stderr
    return r.returncode, [ln for ln in out.splitlines() if "dsqd.service" in ln], out


def test_systemd_analyze_verify(destdir, tmp_path):
    sa = shutil.which("systemd-analyze")
    if not sa:
        pytest.fail("systemd-analyze not found (Debian: package systemd)")
    d, opts = destdir
    unit = rooted(d, os.path.join(opts["prefix"], "lib/systemd/system/dsqd.service"))
    text = open(unit).read()
    # verify checks that ExecStart's binary exists: point it at the copy in
    # the install tree (everything else is verified as installed)
    bindir = os.path.join(opts["prefix"], opts["bindir"])
    text = text.replace(f"ExecStart={bindir}/dsqd", f"ExecStart={rooted(d, bindir)}/dsqd")
    rc, ours, out = verify_unit(sa, text, tmp_path)
    assert rc == 0 and not ours, out
    # and the check can fail: a bad value and an unknown key are reported
    bad = text.replace("Type=notify", "Type=notifyy\nFooBar=1")
    rc, ours, out = verify_unit(sa, bad, tmp_path)
    assert len(ours) >= 2, out


def test_kubernetes_manifests_validate():
    kv = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    if not os.path.exists(kv):
        pytest.fail(f"missing {kv}: run scripts/setup (tests/requirements.txt)")
    files = sorted(glob.glob(os.path.join(SRC, "deploy/kubernetes/*.yaml")))
    assert len(files) >= 4, files
    r = subprocess.run([kv, "--strict", "-k", "1.30.0", *files],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = set(re.findall(r"^kind: (\w+)", "".join(open(f).read() for f in files), re.M))
    assert {"Deployment", "Service", "PodDisruptionBudget"} <= kinds, kinds
    dep = open(os.path.join(SRC, "deploy/kubernetes/deployment.yaml")).read()
    for key in ("nvidia.com/gpu", "readinessProbe", "livenessProbe", "path: /health",
                'prometheus.io/scrape: "true"', "prometheus.io/path: /metrics"):
        assert key in dep, f"deployment.yaml lacks {key}"


def test_kubernetes_validate_rejects_a_broken_manifest(tmp_path):
    kv = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    if not os.path.exists(kv):
        pytest.fail(f"missing {kv}: run scripts/setup (tests/requirements.txt)")
    dep = open(os.path.join(SRC, "deploy/kubernetes/deployment.yaml")).read()
    bad = tmp_path / "bad.yaml"
    bad.write_text(dep.replace("replicas: 2", "replicas: two"))
    r = subprocess.run([kv, "--strict", "-k", "1.30.0", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode != 0, r.stdout + r.stderr
