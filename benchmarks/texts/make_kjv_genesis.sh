#!/bin/sh
# Writes kjv-genesis.txt: the Book of Genesis, King James Version (public domain), as plain prose: one
# paragraph per chapter, verse numbers removed. Non-Austen prose for the draft benchmarks (issue 14).
# Source: Debian's bible-kjv and bible-kjv-text packages (any Debian or Ubuntu with apt).
set -e
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
cd "$tmp"
apt-get download bible-kjv bible-kjv-text >/dev/null 2>&1
for deb in *.deb; do dpkg-deb -x "$deb" root; done
root/usr/bin/bible -p root/usr/lib "gen1:1-50:26" | python3 -c '
import re, sys
chapters = re.split(r"\n\s*Genesis (\d+)\s*\n", "\n" + sys.stdin.read())
out = []
for number, body in zip(chapters[1::2], chapters[2::2]):
    verses = re.split(r"\s*\n\s*\d+ ", "\n" + body.strip())
    out.append(f"Chapter {number}\n\n" + " ".join(" ".join(v.split()) for v in verses if v.strip()))
print("The First Book of Moses, called Genesis\n\n" + "\n\n".join(out))
' > "$here/kjv-genesis.txt"
rm -rf "$tmp"
