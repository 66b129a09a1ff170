#!/bin/sh
# Installs the edgebox agent on a Linux box (Ubuntu, Debian, CentOS and
# others with curl and sha256sum) and enrolls it with its console.
#
# The console serves this script at /install.sh with its URL and the
# SHA-256 pin of its key filled in; 'edgebox token create' prints the line
# to paste, which fetches this script over a connection pinned to that key.
# Everything this script downloads is fetched the same way and checked
# against the console's SHA256SUMS before it runs.
#
#   sh install.sh TOKEN [edgebox-agent install flags: --name, --labels, --proxy, --data]
set -eu

CONSOLE_URL=${EDGEBOX_CONSOLE_URL:-'@@CONSOLE_URL@@'}
KEY_PIN=${EDGEBOX_KEY_PIN:-'@@KEY_PIN@@'}

die() {
	echo "edgebox install: $*" >&2
	exit 1
}

case $CONSOLE_URL in @@*) die "this copy of the script names no console: fetch it from your console's /install.sh, or set EDGEBOX_CONSOLE_URL and EDGEBOX_KEY_PIN" ;; esac
case $KEY_PIN in @@*) die "this copy of the script pins no key: set EDGEBOX_KEY_PIN" ;; esac
[ $# -ge 1 ] || die "usage: sh install.sh TOKEN [--name NAME] [--labels k=v,...] [--proxy URL]"
[ "$(id -u)" = 0 ] || die "run it as root: sudo sh install.sh ..."
[ "$(uname -s)" = Linux ] || die "this script installs on Linux; on Windows use install.ps1"
case $(uname -m) in
x86_64 | amd64) ARCH=amd64 ;;
aarch64 | arm64) ARCH=arm64 ;;
*) die "no agent for this CPU ($(uname -m)); edgebox runs on amd64 and arm64" ;;
esac
command -v curl >/dev/null 2>&1 || die "curl is needed (apt-get install curl, or yum install curl)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum is needed (coreutils)"

# A --proxy flag for the agent is used for the downloads too.
PROXY=${HTTPS_PROXY:-${https_proxy:-}}
prev=
for a in "$@"; do
	case $a in --proxy=*) PROXY=${a#--proxy=} ;; esac
	[ "$prev" = --proxy ] && PROXY=$a
	prev=$a
done

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM

# fetch PATH FILE: a download pinned to the console's key. -k only skips
# the system's CA list, which does not know the console's private CA; the
# pinned key is checked on every connection.
fetch() {
	if ! curl -fsS -k --pinnedpubkey "sha256//$KEY_PIN" ${PROXY:+--proxy "$PROXY"} \
		--retry 3 --connect-timeout 20 -o "$2" "$CONSOLE_URL/$1"; then
		die "could not download $1 from $CONSOLE_URL (curl says why above); if it says the public key does not match the pinned one, that server is not the console this token was made for: nothing was installed"
	fi
}

AGENT=edgebox-agent-linux-$ARCH
echo "edgebox: downloading the agent ($AGENT) from $CONSOLE_URL"
fetch dl/SHA256SUMS "$TMP/SHA256SUMS"
fetch "dl/$AGENT" "$TMP/edgebox-agent"
want=$(awk -v f="$AGENT" '$2 == f || $2 == "*" f { print $1 }' "$TMP/SHA256SUMS")
[ -n "$want" ] || die "the console lists no checksum for $AGENT: nothing was installed"
got=$(sha256sum "$TMP/edgebox-agent" | cut -d' ' -f1)
[ "$got" = "$want" ] || die "the agent's SHA-256 is $got but the console lists $want: the download was changed on the way or on the console; nothing was installed"
echo "edgebox: checksum verified ($got)"
chmod 0755 "$TMP/edgebox-agent"

"$TMP/edgebox-agent" install "$@"
