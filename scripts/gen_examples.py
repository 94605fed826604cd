#!/usr/bin/env python3
"""Generate the example capability folders in examples/capabilities/.

Usage:
    python3 scripts/gen_examples.py [CATALOG_JSON] [--out DIR]

CATALOG_JSON defaults to tests/fixtures/catalog/agentos-catalog.json (the copy in the
repository, license notice in tests/fixtures/README.md); --out defaults to <repo>/examples/capabilities.

The catalog is a JSON list of AgentOS descriptors (extensions, skills, channels)
taken from the npm packages @framers/agentos-extensions-registry@0.18.3,
@framers/agentos-skills-registry@0.18.4 and @framers/agentos-skills@0.10.1
(Apache-2.0, see the NOTICE.md this script writes). A fixed, explicit selection
of them is written as capdex capability folders:

    <folder>/CAPABILITY.yaml   one `key: value` per line; strings, lists and
                               objects are emitted as one-line JSON (a subset of
                               YAML flow syntax)
    <folder>/SKILL.md          skills only: the catalog's skillContent, verbatim
    <folder>/schema.json       some tools: the input JSON schema

A few tool manifests (kind: tool) are not in the catalog: they are written here
so that some of the selected skills' requiredTools resolve. Their names come
from the skills' requiredTools, their descriptions are paraphrased from the
catalog extension named in `derived_from`, and their schemas are our own. capdex's built-in
`tool:echo` is not written here: the binary indexes it itself.

Only the Python standard library is used and the output is deterministic: the
same catalog always gives byte-identical files. Names missing from the catalog
are skipped with a note on stderr.
"""

import argparse
import json
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CATALOG = REPO_ROOT / "tests" / "fixtures" / "catalog" / "agentos-catalog.json"
DEFAULT_OUT = REPO_ROOT / "examples" / "capabilities"

# ---------------------------------------------------------------------------
# Selection (catalog `name`s, per kind). Order matters only for folder-name
# collisions: the first capability to claim a folder name gets it bare, later
# ones get `<name>-<kind>` (skills are processed first, then channels,
# extensions and tools).
# ---------------------------------------------------------------------------

SKILLS = [
    "github",
    "git",
    "coding-agent",
    "cli-tools",
    "web-search",
    "summarize",
    "weather",
    "healthcheck",
    "1password",
    "notion",
    "obsidian",
    "apple-notes",
    "trello",
    "slack-helper",
    "discord-helper",
    "spotify-player",
]

CHANNELS = [
    "telegram",
    "discord",
    "slack",
    "whatsapp",
    "email",
    "sms",
    "signal",
    "teams",
    "matrix",
]

EXTENSIONS = [
    "web-search",
    "web-browser",
    "cli-executor",
    "weather",
    "news-search",
    "github",
    "deep-research",
    "credential-vault",
    "image-generation",
    "calendar-google",
    "email-gmail",
    "notifications",
]

# Derived tool manifests. `name` must appear in the requiredTools of at least
# one selected skill, and every id in `derived_from` must exist in the catalog;
# otherwise the tool is skipped. `schema_file` True -> schema.json, False ->
# inline `inputSchema:`.
TOOLS = [
    {
        "name": "web-search",
        "displayName": "Web Search",
        "description": (
            "Search the web for a query and return a ranked list of results "
            "(title, URL, snippet). Uses SearXNG or DuckDuckGo by default; an "
            "optional Serper or Brave API key gives enhanced results."
        ),
        "category": "information",
        "tags": ["search", "web", "research", "news"],
        "requiredSecrets": [],
        "hasSideEffects": False,
        "derived_from": ["extension:web-search"],
        "schema_file": True,
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Search query"},
                "maxResults": {
                    "type": "integer",
                    "description": "Maximum number of results to return",
                },
            },
            "required": ["query"],
        },
    },
    {
        "name": "filesystem",
        "displayName": "Filesystem",
        "description": (
            "Read, write and list files and directories on the local "
            "filesystem on behalf of the agent."
        ),
        "category": "system",
        "tags": ["filesystem", "files", "read", "write", "directory"],
        "requiredSecrets": [],
        "hasSideEffects": True,
        "derived_from": ["extension:com.framers.system.cli-executor"],
        "schema_file": True,
        "inputSchema": {
            "type": "object",
            "properties": {
                "operation": {
                    "type": "string",
                    "enum": ["read", "write", "list"],
                    "description": "read a file, write a file, or list a directory",
                },
                "path": {"type": "string", "description": "File or directory path"},
                "content": {
                    "type": "string",
                    "description": "Text to write (only for operation write)",
                },
            },
            "required": ["operation", "path"],
        },
    },
    {
        "name": "shell_execute",
        "displayName": "Shell Execute",
        "description": (
            "Execute a shell command in a sandboxed environment and return its "
            "exit code, standard output and standard error."
        ),
        "category": "system",
        "tags": ["shell", "cli", "terminal", "command", "subprocess"],
        "requiredSecrets": [],
        "hasSideEffects": True,
        "derived_from": [
            "extension:cli-executor",
            "extension:com.framers.system.cli-executor",
        ],
        "schema_file": False,
        "inputSchema": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "Shell command line to run"},
                "cwd": {"type": "string", "description": "Working directory for the command"},
                "timeoutMs": {
                    "type": "integer",
                    "description": "Stop the command after this many milliseconds",
                },
            },
            "required": ["command"],
        },
    },
    {
        "name": "github_search",
        "displayName": "GitHub Search",
        "description": (
            "Search GitHub repositories, code, or issues and pull requests "
            "through the GitHub API."
        ),
        "category": "developer",
        "tags": ["github", "search", "code", "repositories", "issues"],
        "requiredSecrets": ["github.token"],
        "hasSideEffects": False,
        "derived_from": ["extension:github", "extension:com.framers.integrations.github"],
        "schema_file": False,
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "GitHub search query; qualifiers such as repo:, language: or is:open are allowed",
                },
                "type": {
                    "type": "string",
                    "enum": ["repositories", "code", "issues"],
                    "description": "What to search: repositories, code, or issues and pull requests",
                },
            },
            "required": ["query"],
        },
    },
]

UPSTREAM_PACKAGES = [
    ("@framers/agentos-extensions-registry", "0.18.3", "extension and channel descriptors"),
    ("@framers/agentos-skills-registry", "0.18.4", "skill descriptors"),
    ("@framers/agentos-skills", "0.10.1", "SKILL.md texts"),
]

# Field order of CAPABILITY.yaml.
FIELDS = [
    "id",
    "kind",
    "name",
    "displayName",
    "description",
    "category",
    "tags",
    "requiredSecrets",
    "requiredTools",
    "hasSideEffects",
    "skillContent",
    "inputSchema",
]

KIND_ORDER = ["skill", "channel", "extension", "tool"]


def slug(name):
    """Filesystem-safe folder name: lowercase, runs outside [a-z0-9] -> '-'."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not s:
        raise ValueError("empty folder name for %r" % name)
    return s


def yaml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, (str, list, dict)):
        # One-line JSON: a valid YAML flow scalar / sequence / mapping.
        return json.dumps(v, ensure_ascii=False)
    raise TypeError("unsupported value %r" % (v,))


def render_manifest(m):
    lines = []
    for key in FIELDS:
        if key not in m:
            continue
        lines.append("%s: %s" % (key, yaml_value(m[key])))
    unknown = set(m) - set(FIELDS)
    if unknown:
        raise ValueError("unexpected manifest keys %s" % sorted(unknown))
    return "\n".join(lines) + "\n"


def write_text(path, text):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def catalog_manifest(d):
    """CAPABILITY.yaml fields for one catalog descriptor (values copied as is)."""
    m = {
        "id": d["id"],
        "kind": d["kind"],
        "name": d["name"],
        "displayName": d["displayName"],
        "description": d["description"],
        "category": d["category"],
        "tags": list(d.get("tags") or []),
        "requiredSecrets": list(d.get("requiredSecrets") or []),
    }
    if d.get("requiredTools"):
        m["requiredTools"] = list(d["requiredTools"])
    if d.get("hasSideEffects") is not None:
        m["hasSideEffects"] = bool(d["hasSideEffects"])
    if d["kind"] == "skill":
        m["skillContent"] = "./SKILL.md"
    return m


def tool_manifest(t):
    m = {
        "id": "tool:" + t["name"],
        "kind": "tool",
        "name": t["name"],
        "displayName": t["displayName"],
        "description": t["description"],
        "category": t["category"],
        "tags": list(t["tags"]),
        "requiredSecrets": list(t["requiredSecrets"]),
        "hasSideEffects": t["hasSideEffects"],
    }
    if not t["schema_file"]:
        m["inputSchema"] = t["inputSchema"]
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("catalog", nargs="?", default=str(DEFAULT_CATALOG),
                    help="path to agentos-catalog.json (default: %(default)s)")
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help="output directory (default: %(default)s)")
    args = ap.parse_args(argv)

    with open(args.catalog, encoding="utf-8") as f:
        catalog = json.load(f)

    by_kind_name = {}
    by_id = {}
    for d in catalog:
        # First occurrence wins (the catalog repeats a few extension names).
        by_kind_name.setdefault((d["kind"], d["name"]), d)
        by_id.setdefault(d["id"], d)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # entries: (folder, manifest, extra files {filename: text}, provenance)
    entries = []
    used = set()

    def claim(name, kind):
        folder = slug(name)
        if folder in used:
            folder = "%s-%s" % (folder, kind)
        if folder in used:
            raise SystemExit("folder name collision: %s" % folder)
        used.add(folder)
        return folder

    selected_skills = []
    for kind, names in (("skill", SKILLS), ("channel", CHANNELS), ("extension", EXTENSIONS)):
        for name in names:
            d = by_kind_name.get((kind, name))
            if d is None:
                print("skip: %s %r not in catalog" % (kind, name), file=sys.stderr)
                continue
            if kind == "skill" and not d.get("skillContent"):
                print("skip: skill %r has no skillContent" % name, file=sys.stderr)
                continue
            files = {}
            if kind == "skill":
                files["SKILL.md"] = d["skillContent"]
                selected_skills.append(d)
            entries.append((claim(name, kind), catalog_manifest(d), files,
                            "catalog `%s` (%s)" % (d["id"], d.get("source", "?"))))

    referenced = set()
    for d in selected_skills:
        referenced.update(d.get("requiredTools") or [])

    for t in TOOLS:
        if t["name"] not in referenced:
            print("skip: tool %r is not required by any selected skill" % t["name"], file=sys.stderr)
            continue
        missing = [i for i in t["derived_from"] if i not in by_id]
        if missing:
            print("skip: tool %r: source %s not in catalog" % (t["name"], missing), file=sys.stderr)
            continue
        files = {}
        if t["schema_file"]:
            files["schema.json"] = json.dumps(t["inputSchema"], indent=2, ensure_ascii=False) + "\n"
        prov = "written for capdex; description paraphrased from %s" % ", ".join(
            "`%s`" % i for i in t["derived_from"])
        entries.append((claim(t["name"], "tool"), tool_manifest(t), files, prov))

    # Warn about (never delete) capability folders this run does not produce.
    produced = {e[0] for e in entries}
    for p in sorted(out.iterdir()):
        if p.is_dir() and (p / "CAPABILITY.yaml").exists() and p.name not in produced:
            print("note: %s is not produced by this script (left in place)" % p, file=sys.stderr)

    for folder, manifest, files, _prov in entries:
        fdir = out / folder
        fdir.mkdir(exist_ok=True)
        write_text(fdir / "CAPABILITY.yaml", render_manifest(manifest))
        for known in ("SKILL.md", "schema.json"):
            if known not in files and (fdir / known).exists():
                (fdir / known).unlink()  # stale output of an earlier run
        for fname, text in sorted(files.items()):
            write_text(fdir / fname, text)
        extra = ", ".join(sorted(files)) or "-"
        inline = " inputSchema" if "inputSchema" in manifest else ""
        print("%-26s %-10s %-40s %s%s" % (folder, manifest["kind"], manifest["id"], extra, inline))

    write_text(out / "NOTICE.md", render_notice(entries))
    print("wrote %d capability folders and NOTICE.md to %s" % (len(entries), out))
    return 0


def render_notice(entries):
    pk = "\n".join("- `%s@%s` (%s)" % p for p in UPSTREAM_PACKAGES)
    rows = "\n".join("| `%s` | `%s` | %s |" % (f, m["id"], prov) for f, m, _files, prov in entries)
    return NOTICE_TEMPLATE.format(packages=pk, rows=rows,
                                  license=APACHE_2_0_TEXT.strip("\n"))


NOTICE_TEMPLATE = """\
# Notice: example capabilities

The capability folders in this directory are **derived** data. They were
generated by `scripts/gen_examples.py` from `agentos-catalog.json` (the capdex
shared test catalog, `data/catalog/agentos-catalog.json`), which compiles the
capability descriptors shipped by these npm packages:

{packages}

What was taken and what was changed:

- `CAPABILITY.yaml` of a catalog entry: the fields `id`, `kind`, `name`,
  `displayName`, `description`, `category`, `tags`, `requiredSecrets` and
  `requiredTools` are copied unchanged from the catalog descriptor and
  reformatted into capdex's manifest format; the other catalog fields (`source`,
  `extra`, `hasSideEffects` when null) are left out, and skills point to their
  `SKILL.md` with `skillContent: "./SKILL.md"`.
- `SKILL.md`: the skill's SKILL.md exactly as shipped in
  `@framers/agentos-skills@0.10.1` (identical to the catalog's `skillContent`),
  not modified.
- Manifests with `kind: tool` are **not** upstream capabilities. Their names are
  tool names that the selected skills list in `requiredTools`; capdex wrote
  their descriptions (paraphrasing the catalog extension named below), tags,
  `hasSideEffects` and input schemas (`schema.json` or `inputSchema`) for these
  examples.

| folder | id | source |
|---|---|---|
{rows}

## License

The upstream packages listed above are licensed under the Apache License,
Version 2.0 (each package's `package.json` declares `"license": "Apache-2.0"`
and each ships the LICENSE text below, which carries the notice
"Copyright (c) 2025 Framers"; package author: Framers AI, https://frame.dev).
The upstream packages ship no NOTICE file. The files in this directory that are
copied or derived from them are distributed under the same license, with the
modifications described above.

```
{license}
```
"""

APACHE_2_0_TEXT = """\
Apache License
Version 2.0, January 2004
http://www.apache.org/licenses/

TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION

1. Definitions.

"License" shall mean the terms and conditions for use, reproduction, and distribution as defined by Sections 1 through 9 of this document.

"Licensor" shall mean the copyright owner or entity authorized by the copyright owner that is granting the License.

"Legal Entity" shall mean the union of the acting entity and all other entities that control, are controlled by, or are under common control with that entity. For the purposes of this definition, "control" means (i) the power, direct or indirect, to cause the direction or management of such entity, whether by contract or otherwise, or (ii) ownership of fifty percent (50%) or more of the outstanding shares, or (iii) beneficial ownership of such entity.

"You" (or "Your") shall mean an individual or Legal Entity exercising permissions granted by this License.

"Source" form shall mean the preferred form for making modifications, including but not limited to software source code, documentation source, and configuration files.

"Object" form shall mean any form resulting from mechanical transformation or translation of a Source form, including but not limited to compiled object code, generated documentation, and conversions to other media types.

"Work" shall mean the work of authorship, whether in Source or Object form, made available under the License, as indicated by a copyright notice that is included in or attached to the work (an example is provided in the Appendix below).

"Derivative Works" shall mean any work, whether in Source or Object form, that is based on (or derived from) the Work and for which the editorial revisions, annotations, elaborations, or other modifications represent, as a whole, an original work of authorship. For the purposes of this License, Derivative Works shall not include works that remain separable from, or merely link (or bind by name) to the interfaces of, the Work and Derivative Works thereof.

"Contribution" shall mean any work of authorship, including the original version of the Work and any modifications or additions to that Work or Derivative Works thereof, that is intentionally submitted to Licensor for inclusion in the Work by the copyright owner or by an individual or Legal Entity authorized to submit on behalf of the copyright owner. For the purposes of this definition, "submitted" means any form of electronic, verbal, or written communication sent to the Licensor or its representatives, including but not limited to communication on electronic mailing lists, source code control systems, and issue tracking systems that are managed by, or on behalf of, the Licensor for the purpose of discussing and improving the Work, but excluding communication that is conspicuously marked or otherwise designated in writing by the copyright owner as "Not a Contribution."

"Contributor" shall mean Licensor and any individual or Legal Entity on behalf of whom a Contribution has been received by Licensor and subsequently incorporated within the Work.

2. Grant of Copyright License.

Subject to the terms and conditions of this License, each Contributor hereby grants to You a perpetual, worldwide, non-exclusive, no-charge, royalty-free, irrevocable copyright license to reproduce, prepare Derivative Works of, publicly display, publicly perform, sublicense, and distribute the Work and such Derivative Works in Source or Object form.

3. Grant of Patent License.

Subject to the terms and conditions of this License, each Contributor hereby grants to You a perpetual, worldwide, non-exclusive, no-charge, royalty-free, irrevocable (except as stated in this section) patent license to make, have made, use, offer to sell, sell, import, and otherwise transfer the Work, where such license applies only to those patent claims licensable by such Contributor that are necessarily infringed by their Contribution(s) alone or by combination of their Contribution(s) with the Work to which such Contribution(s) was submitted. If You institute patent litigation against any entity (including a cross-claim or counterclaim in a lawsuit) alleging that the Work or a Contribution incorporated within the Work constitutes direct or contributory patent infringement, then any patent licenses granted to You under this License for that Work shall terminate as of the date such litigation is filed.

4. Redistribution.

You may reproduce and distribute copies of the Work or Derivative Works thereof in any medium, with or without modifications, and in Source or Object form, provided that You meet the following conditions:

   (a) You must give any other recipients of the Work or Derivative Works a copy of this License; and

   (b) You must cause any modified files to carry prominent notices stating that You changed the files; and

   (c) You must retain, in the Source form of any Derivative Works that You distribute, all copyright, patent, trademark, and attribution notices from the Source form of the Work, excluding those notices that do not pertain to any part of the Derivative Works; and

   (d) If the Work includes a "NOTICE" text file as part of its distribution, then any Derivative Works that You distribute must include a readable copy of the attribution notices contained within such NOTICE file, excluding those notices that do not pertain to any part of the Derivative Works, in at least one of the following places: within a NOTICE text file distributed as part of the Derivative Works; within the Source form or documentation, if provided along with the Derivative Works; or, within a display generated by the Derivative Works, if and wherever such third-party notices normally appear. The contents of the NOTICE file are for informational purposes only and do not modify the License. You may add Your own attribution notices within Derivative Works that You distribute, alongside or as an addendum to the NOTICE text from the Work, provided that such additional attribution notices cannot be construed as modifying the License.

You may add Your own copyright statement to Your modifications and may provide additional or different license terms and conditions for use, reproduction, or distribution of Your modifications, or for any such Derivative Works as a whole, provided Your use, reproduction, and distribution of the Work otherwise complies with the conditions stated in this License.

5. Submission of Contributions.

Unless You explicitly state otherwise, any Contribution intentionally submitted for inclusion in the Work by You to the Licensor shall be under the terms and conditions of this License, without any additional terms or conditions. Notwithstanding the above, nothing herein shall supersede or modify the terms of any separate license agreement you may have executed with Licensor regarding such Contributions.

6. Trademarks.

This License does not grant permission to use the trade names, trademarks, service marks, or product names of the Licensor, except as required for reasonable and customary use in describing the origin of the Work and reproducing the content of the NOTICE file.

7. Disclaimer of Warranty.

Unless required by applicable law or agreed to in writing, Licensor provides the Work (and each Contributor provides its Contributions) on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied, including, without limitation, any warranties or conditions of TITLE, NON-INFRINGEMENT, MERCHANTABILITY, or FITNESS FOR A PARTICULAR PURPOSE. You are solely responsible for determining the appropriateness of using or redistributing the Work and assume any risks associated with Your exercise of permissions under this License.

8. Limitation of Liability.

In no event and under no legal theory, whether in tort (including negligence), contract, or otherwise, unless required by applicable law (such as deliberate and grossly negligent acts) or agreed to in writing, shall any Contributor be liable to You for damages, including any direct, indirect, special, incidental, or consequential damages of any character arising as a result of this License or out of the use or inability to use the Work (including but not limited to damages for loss of goodwill, work stoppage, computer failure or malfunction, or any and all other commercial damages or losses), even if such Contributor has been advised of the possibility of such damages.

9. Accepting Warranty or Additional Liability.

While redistributing the Work or Derivative Works thereof, You may choose to offer, and charge a fee for, acceptance of support, warranty, indemnity, or other liability obligations and/or rights consistent with this License. However, in accepting such obligations, You may act only on Your own behalf and on Your sole responsibility, not on behalf of any other Contributor, and only if You agree to indemnify, defend, and hold each Contributor harmless for any liability incurred by, or claims asserted against, such Contributor by reason of your accepting any such warranty or additional liability.

END OF TERMS AND CONDITIONS

APPENDIX: How to apply the Apache License to your work.

   To apply the Apache License to your work, attach the following
   boilerplate notice, with the fields enclosed by brackets "[]"
   replaced with your own identifying information. (Don't include
   the brackets!)  The text should be enclosed in the appropriate
   comment syntax for the file format. We also recommend that a
   file or class name and description of purpose be included on the
   same "printed page" as the copyright notice for easier
   identification within third-party archives.

   Copyright (c) 2025 Framers

   Licensed under the Apache License, Version 2.0 (the "License");
   you may not use this file except in compliance with the License.
   You may obtain a copy of the License at

       http://www.apache.org/licenses/LICENSE-2.0

   Unless required by applicable law or agreed to in writing, software
   distributed under the License is distributed on an "AS IS" BASIS,
   WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
   See the License for the specific language governing permissions and
   limitations under the License.


"""


if __name__ == "__main__":
    sys.exit(main())
