"""Static checks of terraform/ (no terraform binary can be installed here):

- every .tf file parses (python-hcl2), and the modules say what matters: the bucket is
  unversioned, SSE-KMS with a rotated key, public access blocked, ACLs off, a TLS-only bucket
  policy, and a lifecycle whose only action aborts unfinished multipart uploads under each
  cluster prefix (nothing ever expires a manifest); every IAM policy is scoped to the
  cluster's prefix, with exactly the S3 actions Strata issues, and the replay role reads
  only; only the Kafka listener is open to client networks; controllers and brokers are on
  i4i / i3en instances spread over three zones with `rack` = the zone;
- the config templates, rendered as terraform's templatefile would, are accepted by
  `strata config check` and say what the module meant (rack, controllers, cold url);
- checkov finds no failed check (offline it reports no severities, so none at all may fail),
  its skips are the justified ones, and a deliberately broken copy does fail.

The templates are rendered by `render_template`, a strict subset of terraform's template
language (`${name}`, `${jsonencode(name)}`, `%{ for k, v in name ~}`): anything else in a
template fails the test rather than being rendered differently from terraform.
test_terraform_iam.py runs real processes under the rendered IAM policies.
"""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from conftest import REPO, strata_bin

TF = REPO / "terraform"
MODULES = TF / "modules"
EXAMPLE = TF / "examples" / "three-by-three"
CHECKOV = Path(os.environ.get("STRATA_CHECKOV", str(REPO / ".venv-checkov" / "bin" / "checkov")))

# The S3 actions Strata's object_store client issues (cold/src: store.rs, manifest.rs,
# upload.rs, catalog.rs, orphans.rs, retention.rs, read.rs; compactor/src/job.rs):
# ListObjectsV2; GetObject (whole and ranged); PutObject (incl. If-None-Match: *),
# multipart Create/UploadPart/Complete and CopyObject's destination; AbortMultipartUpload;
# DeleteObject.
READ_WRITE = {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:DeleteObject"}
READ_ONLY = {"s3:ListBucket", "s3:GetObject"}

# Values the tests render the templates with.
VARS = {
    "partition": "aws",
    "region": "us-east-1",
    "bucket": "strata-cold-test",
    "prefix": "prod-1",
    "kms_key_arn": "arn:aws:kms:us-east-1:123456789012:key/0b7a1c1e-4d5e-4f60-9a7b-000000000001",
}


# --- parsing ---------------------------------------------------------------------------------

def unquote(v):
    """python-hcl2 keeps the quotes of string literals and labels: drop them, recursively."""
    if isinstance(v, str):
        return v[1:-1] if len(v) >= 2 and v[0] == '"' and v[-1] == '"' else v
    if isinstance(v, list):
        return [unquote(x) for x in v]
    if isinstance(v, dict):
        return {unquote(k): unquote(x) for k, x in v.items() if k not in ("__is_block__", "__comments__")}
    return v


def parse(path: Path) -> dict:
    import hcl2

    with open(path) as f:
        return unquote(hcl2.load(f))


def tf_files():
    return sorted(TF.rglob("*.tf"))


def blocks(kind: str, directory: Path):
    """{(type, name): body} of the resources / data sources in `directory`'s .tf files."""
    out = {}
    for f in sorted(directory.glob("*.tf")):
        for entry in parse(f).get(kind, []):
            for rtype, named in entry.items():
                for name, body in named.items():
                    out[(rtype, name)] = body
    return out


def resources(module: str, rtype: str):
    return {name: body for (t, name), body in blocks("resource", MODULES / module).items() if t == rtype}


def one(module: str, rtype: str):
    found = resources(module, rtype)
    assert len(found) == 1, f"{module}: expected one {rtype}, found {sorted(found)}"
    return next(iter(found.values()))


def first(block):
    """A nested block: python-hcl2 gives a list of one dict."""
    assert isinstance(block, list) and len(block) == 1, block
    return block[0]


def module_locals(module: str) -> dict:
    out = {}
    for f in (MODULES / module).glob("*.tf"):
        for entry in parse(f).get("locals", []):
            out.update(entry)
    return out


def variables(directory: Path) -> dict:
    out = {}
    for f in directory.glob("*.tf"):
        for entry in parse(f).get("variable", []):
            out.update(entry)
    return out


def split_top(text: str, sep: str = ","):
    """Splits at `sep` outside brackets and strings."""
    parts, depth, cur, in_str = [], 0, "", False
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            in_str = not in_str
        if not in_str:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif ch == sep and depth == 0:
                parts.append(cur.strip())
                cur = ""
                continue
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def object_keys(expr: str) -> dict:
    """{key: expression} of an HCL object constructor `{a = x, b = y}` as python-hcl2 prints it."""
    expr = expr.strip()
    assert expr.startswith("{") and expr.endswith("}"), expr
    out = {}
    for part in split_top(expr[1:-1]):
        k, _, v = part.partition("=")
        out[k.strip()] = v.strip()
    return out


def templatefile_args(expr: str, template: str) -> dict:
    """The variables object of the templatefile() call of `template` inside `expr`."""
    m = re.search(r'templatefile\("\$\{path\.module\}/[a-z]+/' + re.escape(template) + r'", ', expr)
    assert m, f"no templatefile() of {template} in {expr[:200]}"
    rest = expr[m.end():]
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch in "({["
        depth -= ch in ")}]"
        if depth < 0:
            return object_keys(rest[:i]) if rest.startswith("{") else {"__ref__": rest[:i]}
    raise AssertionError(f"unbalanced templatefile() call of {template}")


# --- terraform's template language, the subset the templates use ---------------------------

_FOR = re.compile(r"%\{\s*for\s+(\w+)\s*,\s*(\w+)\s+in\s+(\w+)\s*(~?)\}(.*?)%\{\s*endfor\s*(~?)\}", re.S)
_INTERP = re.compile(r"\$\{\s*(?:(jsonencode)\(\s*(\w+)\s*\)|(\w+))\s*\}")


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def render_template(text: str, values: dict) -> str:
    """What terraform's templatefile(path, values) returns for the templates here. Unknown
    syntax or a missing variable raises, as terraform would fail."""
    out, at = "", 0
    for m in _FOR.finditer(text):
        out += text[at:m.start()]
        key, val, name, strip_for, body, strip_end = m.groups()
        if strip_for:
            body = body.lstrip()
        for k in sorted(values[name]):  # terraform iterates a map in key order
            out += render_template(body, {**values, key: k, val: values[name][k]})
        at = m.end()
        if strip_end:
            while at < len(text) and text[at].isspace():
                at += 1
    out += text[at:]

    def sub(m):
        fn, arg, plain = m.groups()
        if fn == "jsonencode":
            return json.dumps(values[arg], separators=(",", ":"))
        return _value(values[plain])

    rendered = _INTERP.sub(sub, out)
    leftover = re.search(r"[$%]\{", rendered)
    assert leftover is None, f"template syntax this renderer does not know: {rendered[leftover.start():][:60]!r}"
    return rendered


def template_vars(text: str) -> set:
    """The variables a template reads (loop variables excluded)."""
    loop_vars = {v for m in _FOR.finditer(text) for v in m.group(1, 2)}
    names = {m.group(2) or m.group(3) for m in _INTERP.finditer(text)} | {m.group(3) for m in _FOR.finditer(text)}
    return names - loop_vars


def render_policy(name: str, **overrides) -> dict:
    text = (MODULES / "iam" / "policies" / f"{name}.json.tftpl").read_text()
    return json.loads(render_template(text, {**VARS, **overrides}))


def statements(policy: dict):
    st = policy["Statement"]
    return st if isinstance(st, list) else [st]


def as_list(v):
    return v if isinstance(v, list) else [v]


# --- the files -------------------------------------------------------------------------------

def test_every_tf_file_parses_and_pins_the_aws_provider():
    files = tf_files()
    for d in (MODULES / "bucket", MODULES / "iam", MODULES / "nodes", EXAMPLE):
        assert list(d.glob("*.tf")), f"{d} has no .tf file"
    for f in files:
        parse(f)
    for d in (MODULES / "bucket", MODULES / "iam", MODULES / "nodes", EXAMPLE):
        tf = [e for f in d.glob("*.tf") for e in parse(f).get("terraform", [])]
        assert tf, f"{d}: no terraform block"
        aws = first(tf[0]["required_providers"])["aws"]
        assert aws["source"] == "hashicorp/aws" and aws["version"] == "~> 5.0", (d, aws)
    # The example wires the three modules together.
    mods = {name: body for f in EXAMPLE.glob("*.tf") for e in parse(f).get("module", []) for name, body in e.items()}
    assert {m["source"] for m in mods.values()} == {"../../modules/bucket", "../../modules/iam", "../../modules/nodes"}
    assert mods["nodes"]["controller_count"] == 3 and mods["nodes"]["broker_count"] == 3


def test_example_tfvars_give_every_required_variable():
    import hcl2

    required = {k for k, v in variables(EXAMPLE).items() if "default" not in v}
    given = set(unquote(hcl2.loads((EXAMPLE / "terraform.tfvars.example").read_text())))
    assert required <= given, f"terraform.tfvars.example lacks {required - given}"
    assert given <= set(variables(EXAMPLE)), f"unknown variables {given - set(variables(EXAMPLE))}"


# --- the bucket ------------------------------------------------------------------------------

def test_bucket_is_unversioned_kms_encrypted_private_and_tls_only():
    versioning = first(one("bucket", "aws_s3_bucket_versioning")["versioning_configuration"])
    assert versioning["status"] in ("Disabled", "Suspended"), versioning

    sse = first(one("bucket", "aws_s3_bucket_server_side_encryption_configuration")["rule"])
    default = first(sse["apply_server_side_encryption_by_default"])
    assert default["sse_algorithm"] == "aws:kms", default
    assert default["kms_master_key_id"] == "${aws_kms_key.cold.arn}", default
    assert sse["bucket_key_enabled"] is True
    key = one("bucket", "aws_kms_key")
    assert key["enable_key_rotation"] is True

    pab = one("bucket", "aws_s3_bucket_public_access_block")
    for flag in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"):
        assert pab[flag] is True, flag
    assert first(one("bucket", "aws_s3_bucket_ownership_controls")["rule"])["object_ownership"] == "BucketOwnerEnforced"

    policy_res = one("bucket", "aws_s3_bucket_policy")
    args = templatefile_args(policy_res["policy"], "bucket-policy.json.tftpl")
    text = (MODULES / "bucket" / "templates" / "bucket-policy.json.tftpl").read_text()
    assert template_vars(text) == set(args), (template_vars(text), args)
    policy = json.loads(render_template(text, VARS))
    bucket_arn = f"arn:aws:s3:::{VARS['bucket']}"
    tls_only = [s for s in statements(policy)
                if s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"]
    assert tls_only, f"no TLS-only statement in {policy}"
    s = tls_only[0]
    assert s["Principal"] == "*" and as_list(s["Action"]) == ["s3:*"], s
    assert set(as_list(s["Resource"])) == {bucket_arn, bucket_arn + "/*"}, s
    assert not [s for s in statements(policy) if s["Effect"] == "Allow"], "the bucket policy only denies"


def test_lifecycle_only_aborts_unfinished_uploads_under_the_cluster_prefixes():
    lc = one("bucket", "aws_s3_bucket_lifecycle_configuration")
    rules = [r for d in lc.get("dynamic", []) for label, r in d.items() if label == "rule"]
    static = lc.get("rule", [])
    assert len(rules) == 1 and not static, lc
    assert rules[0]["for_each"] == "${var.cluster_prefixes}"
    rule = first(rules[0]["content"])
    assert rule["status"] == "Enabled"
    assert first(rule["filter"])["prefix"] == "${rule.value}/", "scoped to the cluster's prefix"
    actions = set(rule) - {"id", "status", "filter"}
    assert actions == {"abort_incomplete_multipart_upload"}, f"a lifecycle action that could touch objects: {actions}"
    days = first(rule["abort_incomplete_multipart_upload"])["days_after_initiation"]
    assert days == "${var.abort_incomplete_multipart_upload_days}"
    default = variables(MODULES / "bucket")["abort_incomplete_multipart_upload_days"]["default"]
    assert default >= 1

    # What the rules would do to the keys Strata writes: an aborted upload never is a
    # manifest (manifests are single create-only PUTs), and no rule expires or transitions
    # a completed object, so a manifest key is matched by no object-expiring action.
    prefix = VARS["prefix"]
    manifest = f"{prefix}/strata/6f1c/0/manifest/00000000000000000007.json"
    segment = f"{prefix}/strata/6f1c/0/segments/00000000000000000000-1-ab.log"
    expiring = [r for r in [rule] if set(r) & {"expiration", "transition", "noncurrent_version_expiration",
                                                "noncurrent_version_transition"}]
    for key in (manifest, segment):
        assert key.startswith(first(rule["filter"])["prefix"].replace("${rule.value}", prefix))
        assert not expiring, f"{key} would be expired or moved"


# --- IAM -------------------------------------------------------------------------------------

def test_iam_policies_are_scoped_to_the_prefix_with_exactly_strata_s_actions():
    bucket_arn = f"arn:aws:s3:::{VARS['bucket']}"
    objects = f"{bucket_arn}/{VARS['prefix']}/*"
    expected = {"broker": (READ_WRITE, {"kms:Decrypt", "kms:GenerateDataKey"}),
                "compactor": (READ_WRITE, {"kms:Decrypt", "kms:GenerateDataKey"}),
                "replay": (READ_ONLY, {"kms:Decrypt"})}
    for name, (s3_actions, kms_actions) in expected.items():
        policy = render_policy(name)
        seen_s3, seen_kms = set(), set()
        for s in statements(policy):
            assert s["Effect"] == "Allow", (name, s)
            assert "NotAction" not in s and "NotResource" not in s, (name, s)
            actions = set(as_list(s["Action"]))
            assert not any("*" in a for a in actions), f"{name}: wildcard action in {s}"
            resources_ = as_list(s["Resource"])
            if actions <= {"s3:ListBucket"}:
                assert resources_ == [bucket_arn], (name, s)
                prefixes = as_list(s["Condition"]["StringLike"]["s3:prefix"])
                assert prefixes and all(p.startswith(VARS["prefix"] + "/") for p in prefixes), (name, prefixes)
                assert set(s["Condition"]) == {"StringLike"}, s
                seen_s3 |= actions
            elif all(a.startswith("s3:") for a in actions):
                assert resources_ == [objects], f"{name}: objects outside the prefix: {s}"
                seen_s3 |= actions
            elif all(a.startswith("kms:") for a in actions):
                assert resources_ == [VARS["kms_key_arn"]], (name, s)
                assert s["Condition"]["StringEquals"]["kms:ViaService"] == f"s3.{VARS['region']}.amazonaws.com"
                seen_kms |= actions
            else:
                raise AssertionError(f"{name}: a statement mixing services: {s}")
        assert seen_s3 == s3_actions, f"{name}: {seen_s3} != {s3_actions}"
        assert seen_kms == kms_actions, f"{name}: {seen_kms}"
    replay = {a for s in statements(render_policy("replay")) for a in as_list(s["Action"])}
    assert not {a for a in replay if re.search(r"Put|Delete|Abort|Copy|Restore", a)}, replay


def test_iam_roles_use_the_templates_and_the_controller_gets_no_s3():
    policies = resources("iam", "aws_iam_role_policy")
    policy_vars = module_locals("iam")["policy_vars"]
    assert isinstance(policy_vars, dict), policy_vars
    used = {}
    for name, body in policies.items():
        role = re.fullmatch(r"\$\{aws_iam_role\.(\w+)\.id\}", body["role"]).group(1)
        template = re.search(r"policies/(\w+)\.json\.tftpl", body["policy"]).group(1)
        assert templatefile_args(body["policy"], f"{template}.json.tftpl") == {"__ref__": "local.policy_vars"}
        used[role] = template
        text = (MODULES / "iam" / "policies" / f"{template}.json.tftpl").read_text()
        assert template_vars(text) <= set(policy_vars), (template, template_vars(text), policy_vars)
    assert used == {"broker": "broker", "compactor": "compactor", "replay": "replay"}, used
    assert set(policy_vars) == set(VARS), "the test renders with every variable terraform passes"
    roles = resources("iam", "aws_iam_role")
    assert set(roles) == {"broker", "controller", "compactor", "replay"}
    # Only the SSM core policy is ever attached; the controller has nothing else.
    for body in resources("iam", "aws_iam_role_policy_attachment").values():
        assert body["policy_arn"] == "${local.ssm_core}"
    assert module_locals("iam")["ssm_core"].endswith(":iam::aws:policy/AmazonSSMManagedInstanceCore")
    # The replay role trusts the named audit principals, nobody else.
    assert "Principal = {AWS = var.replay_principal_arns}" in roles["replay"]["assume_role_policy"]
    for name in ("broker", "controller"):
        assert roles[name]["assume_role_policy"] == "${local.ec2_trust}"


# --- nodes -----------------------------------------------------------------------------------

def test_only_the_kafka_listener_is_open_to_client_networks():
    ingress = resources("nodes", "aws_vpc_security_group_ingress_rule")
    assert ingress
    for name, rule in ingress.items():
        if any(k in rule for k in ("cidr_ipv4", "cidr_ipv6", "prefix_list_id")):
            assert rule["from_port"] == rule["to_port"] == "${var.kafka_port}", f"{name} opens a non-Kafka port to a network"
            assert rule["security_group_id"] == "${aws_security_group.kafka_clients.id}", name
        else:
            assert "referenced_security_group_id" in rule, name
            if rule["referenced_security_group_id"] != "${aws_security_group.cluster.id}":
                # Other groups: Kafka clients, or Prometheus on the metrics port.
                assert (rule["from_port"], rule["security_group_id"]) in (
                    ("${var.kafka_port}", "${aws_security_group.kafka_clients.id}"),
                    ("${var.metrics_port}", "${aws_security_group.cluster.id}")), name
        assert rule["ip_protocol"] == "tcp" and rule["from_port"] == rule["to_port"], name
    for sg in resources("nodes", "aws_security_group").values():
        assert "ingress" not in sg and "egress" not in sg, "rules are separate resources"
    # Brokers are in the client-facing group, controllers are not.
    enis = resources("nodes", "aws_network_interface")
    assert "${aws_security_group.kafka_clients.id}" in enis["broker"]["security_groups"]
    assert enis["controller"]["security_groups"] == ["${aws_security_group.cluster.id}"]
    # The example does not open the brokers to the internet.
    import hcl2

    tfvars = unquote(hcl2.loads((EXAMPLE / "terraform.tfvars.example").read_text()))
    assert "0.0.0.0/0" not in tfvars["client_cidr_blocks"]
    # Egress to anywhere only on HTTPS.
    for name, rule in resources("nodes", "aws_vpc_security_group_egress_rule").items():
        if "cidr_ipv4" in rule:
            assert rule["from_port"] == rule["to_port"] == 443, name


def test_nodes_are_nvme_instances_across_three_zones():
    v = variables(MODULES / "nodes")
    pattern = re.compile(r"^(i4i|i3en)\.[0-9a-z]+$")
    for var in ("controller_instance_type", "broker_instance_type"):
        assert pattern.match(v[var]["default"]), v[var]
        assert "(i4i|i3en)" in first(v[var]["validation"])["condition"]
    mods = {n: b for f in EXAMPLE.glob("*.tf") for e in parse(f).get("module", []) for n, b in e.items()}
    for var in ("controller_instance_type", "broker_instance_type"):
        assert pattern.match(mods["nodes"][var]), mods["nodes"][var]
    assert "length(var.subnet_ids) == 3" in first(v["subnet_ids"]["validation"])["condition"]
    instances = resources("nodes", "aws_instance")
    enis = resources("nodes", "aws_network_interface")
    assert set(instances) == set(enis) == {"controller", "broker"}
    for role in ("controller", "broker"):
        assert enis[role]["subnet_id"] == "${var.subnet_ids[count.index % 3]}", role
        inst = instances[role]
        assert inst["instance_type"] == f"${{var.{role}_instance_type}}"
        assert first(inst["network_interface"])["network_interface_id"] == f"${{aws_network_interface.{role}[count.index].id}}"
        assert first(inst["metadata_options"])["http_tokens"] == "required"
        assert first(inst["root_block_device"])["encrypted"] is True
        pre = first(first(inst["lifecycle"])["precondition"])
        assert pre["condition"] == "${length(distinct(local.zones)) == 3}"
        assert inst["user_data"] == f"${{local.cloud_init.{role}[count.index]}}"
    zones = module_locals("nodes")["zones"]
    assert zones == "${[for s in data.aws_subnet.zone : s.availability_zone]}"


def node_configs():
    """The controller and broker configs as the nodes module renders them, for a cluster in
    three zones, with the variables checked against the module's templatefile() calls."""
    loc = module_locals("nodes")
    zones = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
    controllers = [f"10.0.{i}.10:9093" for i in (1, 2, 3)]
    out = {}
    for role, expr in (("controller", loc["controller_configs"]), ("broker", loc["broker_configs"])):
        args = templatefile_args(expr, f"{role}.toml.tftpl")
        assert args["rack"] == "local.zones[i % 3]", "the rack is the node's zone"
        text = (MODULES / "nodes" / "templates" / f"{role}.toml.tftpl").read_text()
        assert template_vars(text) == set(args), (role, template_vars(text) ^ set(args))
        for i in range(3):
            values = {
                "cluster_name": "prod-1", "node_id": i + 1, "rack": zones[i % 3], "data_dir": "/var/lib/strata/data",
                "metrics_port": 9096, "controller_port": 9093, "kafka_port": 9092, "grpc_port": 9095,
                "voters": {str(n + 1): a for n, a in enumerate(controllers)}, "controllers": controllers,
                "advertised_host": f"10.0.{i + 1}.20", "cluster_id": "strata", "region": "eu-west-1",
                "cold_url": f"s3://{VARS['bucket']}/{VARS['prefix']}",
            }
            out[(role, i + 1)] = render_template(text, {k: values[k] for k in args})
    return out, zones, controllers


def test_rendered_configs_are_accepted_by_strata_config_check(tmp_path):
    configs, zones, controllers = node_configs()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA__")}
    for (role, node), text in configs.items():
        path = tmp_path / f"{role}-{node}.toml"
        path.write_text(text)
        res = subprocess.run([strata_bin(), "config", "check", str(path)], capture_output=True, text=True,
                             timeout=30, env=env)
        assert res.returncode == 0, f"{role}-{node}: {res.stderr}\n{text}"
        effective = tomllib.loads(res.stdout)
        if role == "broker":
            assert effective["roles"] == ["broker"] and effective["node_id"] == node
            assert effective["cluster"]["rack"] == zones[(node - 1) % 3]
            assert effective["cluster"]["controllers"] == controllers
            assert effective["cold"]["url"] == f"s3://{VARS['bucket']}/{VARS['prefix']}"
            assert effective["kafka"]["advertised_host"] == f"10.0.{node}.20"
            assert effective["kafka"]["listen"].endswith(":9092")
        else:
            assert effective["roles"] == ["controller"]
            assert effective["controller"]["node_id"] == node
            assert effective["controller"]["voters"] == {str(n + 1): a for n, a in enumerate(controllers)}
        assert effective["metrics"]["listen"].endswith(":9096")
    # A config with a misspelt field is refused: the check above can fail.
    bad = tmp_path / "bad.toml"
    bad.write_text(configs[("broker", 1)].replace("rack =", "racks ="))
    res = subprocess.run([strata_bin(), "config", "check", str(bad)], capture_output=True, text=True, timeout=30, env=env)
    assert res.returncode != 0 and "racks" in res.stderr, res.stderr


def test_cloud_init_writes_the_config_and_starts_strata_server():
    expr = module_locals("nodes")["cloud_init"]
    files = dict(re.findall(r'\{path = "([^"]+)", owner = "root:root", permissions = "\d+", content = (config|file\("[^"]+"\))\}', expr))
    assert files["/etc/strata/strata.toml"] == "config"
    written = {}
    for path, content in files.items():
        if path == "/etc/strata/strata.toml":
            continue
        m = re.fullmatch(r'file\("\$\{path\.module\}/([^"]+)"\)', content)
        assert m, content
        written[path] = (MODULES / "nodes" / m.group(1)).resolve().read_text()
    assert "yamlencode({packages" in expr and '"#cloud-config"' in expr
    # The repository's unit (deploy/strata.service, checked by test_deploy.py) ...
    assert re.search(r'"/etc/systemd/system/strata.service", [^}]*file\("\$\{path.module\}/../../../deploy/strata.service"\)', expr)
    unit = written["/etc/systemd/system/strata.service"]
    assert unit == (REPO / "deploy" / "strata.service").read_text()
    service = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert service["ExecStart"].startswith("/usr/local/bin/strata server --config /etc/strata/strata.toml"), service
    assert service["Restart"] == "on-failure"
    assert int(service["LimitNOFILE"]) >= 65536
    assert int(service["TimeoutStopSec"]) >= 60
    assert service["User"] == "strata"
    assert "/var/lib/strata" in service["ReadWritePaths"]
    # ... with a drop-in that waits for the NVMe file system.
    dropin = dict(line.split("=", 1) for line in written["/etc/systemd/system/strata.service.d/10-instance-store.conf"].splitlines()
                  if "=" in line and not line.startswith("#"))
    assert dropin == {"Requires": "strata-disk.service", "After": "strata-disk.service", "RequiresMountsFor": "/var/lib/strata"}
    disk = dict(line.split("=", 1) for line in written["/etc/systemd/system/strata-disk.service"].splitlines() if "=" in line)
    script = disk["ExecStart"].split()[0]
    assert script in written, f"{script} is not written by cloud-init"
    assert "/usr/local/bin/strata" in written["/usr/local/sbin/strata-install"]
    assert '["/usr/local/sbin/strata-install", var.strata_binary_url, var.strata_binary_sha256]' in expr
    assert '["systemctl", "enable", "--now", "strata-disk.service", "strata.service"]' in expr
    # EC2 takes at most 16 KB of user data: what cloud-init carries, with a margin for YAML.
    configs, _, _ = node_configs()
    assert sum(map(len, written.values())) + max(map(len, configs.values())) < 12_000
    for path, text in written.items():
        if text.startswith("#!/bin/bash"):
            res = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
            assert res.returncode == 0, f"{path}: {res.stderr}"
            assert "set -euo pipefail" in text, path


def test_outputs_give_the_bootstrap_addresses():
    outs = {n: b for f in (MODULES / "nodes").glob("*.tf") for e in parse(f).get("output", []) for n, b in e.items()}
    assert outs["bootstrap_servers"]["value"] == '${join(",", local.broker_endpoints)}'
    assert module_locals("nodes")["broker_endpoints"] == \
        '${[for eni in aws_network_interface.broker : "${eni.private_ip}:${var.kafka_port}"]}'
    ex = {n: b for f in EXAMPLE.glob("*.tf") for e in parse(f).get("output", []) for n, b in e.items()}
    assert ex["bootstrap_servers"]["value"] == "${module.nodes.bootstrap_servers}"


# --- checkov ---------------------------------------------------------------------------------

JUSTIFIED_SKIPS = {"CKV_AWS_21", "CKV_AWS_144", "CKV2_AWS_62"}


def run_checkov(directory: Path) -> dict:
    if not CHECKOV.exists():
        pytest.fail(f"checkov not found at {CHECKOV}: scripts/test.sh installs it into .venv-checkov "
                    f"(it cannot share .venv: it pins boto3 and packaging); or set STRATA_CHECKOV", pytrace=False)
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    # --skip-download: no call to the Prisma Cloud API (offline, so no severities either).
    res = subprocess.run([str(CHECKOV), "-d", str(directory), "--framework", "terraform", "--skip-download",
                          "--output", "json"], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    report = json.loads(res.stdout)
    if isinstance(report, list):
        (report,) = [r for r in report if r.get("check_type") == "terraform"]
    return report


def test_checkov_finds_nothing_and_every_skip_is_justified():
    report = run_checkov(TF)
    summary = report["summary"]
    failed = report["results"].get("failed_checks", [])
    # Offline checkov reports no severity; then no check at all may fail.
    severities = {c.get("severity") for c in failed}
    if severities - {None}:
        failed = [c for c in failed if c.get("severity") in ("HIGH", "CRITICAL")]
    assert not failed, "\n".join(f"{c['check_id']} {c['resource']} {c['file_path']}" for c in failed)
    assert summary["parsing_errors"] == 0, summary
    passed = report["results"]["passed_checks"]
    scanned = {c["resource"].split("[")[0].rsplit(".", 1)[0].split(".")[-1] for c in passed}
    for rtype in ("aws_s3_bucket", "aws_s3_bucket_public_access_block", "aws_kms_key", "aws_iam_role",
                  "aws_iam_role_policy", "aws_instance", "aws_security_group", "aws_vpc_security_group_ingress_rule"):
        assert rtype in scanned, f"checkov did not check any {rtype}: {sorted(scanned)}"
    skipped = report["results"].get("skipped_checks", [])
    assert {c["check_id"] for c in skipped} <= JUSTIFIED_SKIPS, [c["check_id"] for c in skipped]
    for c in skipped:
        reason = c["check_result"].get("suppress_comment", "").strip()
        assert len(reason) > 60, f"{c['check_id']}: skip without a reason: {reason!r}"
    print(f"checkov: {summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped "
          f"({', '.join(sorted(c['check_id'] for c in skipped))})")
    for c in skipped:
        print(f"  skip {c['check_id']}: {c['check_result']['suppress_comment'].strip()}")


def test_checkov_fails_a_public_bucket(tmp_path):
    """The scan above can fail: the same tree with the public access block off does."""
    copy = tmp_path / "terraform"
    shutil.copytree(TF, copy, ignore=shutil.ignore_patterns(".terraform*", "*.md"))
    main = copy / "modules" / "bucket" / "main.tf"
    text = main.read_text()
    assert "block_public_acls       = true" in text
    main.write_text(text.replace("block_public_acls       = true", "block_public_acls       = false"))
    report = run_checkov(copy)
    failed = {c["check_id"] for c in report["results"].get("failed_checks", [])}
    assert "CKV_AWS_53" in failed, failed
