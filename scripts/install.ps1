# Installs the edgebox agent on a Windows box (PowerShell 5.1 or later, run
# as administrator) and enrolls it with its console.
#
# The console serves this script at /install.ps1 with its URL and the
# SHA-256 of its CA filled in; 'edgebox token create' prints the line to
# paste, which fetches this script over a connection checked against that
# CA. Everything this script downloads is fetched the same way and checked
# against the console's SHA256SUMS before it runs.
#
# From the Windows zip of a release, which holds edgebox-agent.exe beside
# this script, it installs that binary instead of downloading one (the
# token still pins the console's CA for enrollment).
#
#   .\install.ps1 -Token TOKEN [-Name NAME] [-Labels k=v,...] [-Proxy URL] [-Agent PATH]
param(
    [Parameter(Mandatory = $true)][string]$Token,
    [string]$Agent = "",
    [string]$Name = "",
    [string]$Labels = "",
    [string]$Proxy = ""
)
$ErrorActionPreference = "Stop"

$ConsoleUrl = if ($env:EDGEBOX_CONSOLE_URL) { $env:EDGEBOX_CONSOLE_URL } else { '@@CONSOLE_URL@@' }
$CaSha256 = if ($env:EDGEBOX_CA_SHA256) { $env:EDGEBOX_CA_SHA256 } else { '@@CA_SHA256@@' }

function Fail([string]$msg) {
    Write-Host "edgebox install: $msg" -ForegroundColor Red
    exit 1
}

if ($Agent -eq "" -and $PSScriptRoot -and (Test-Path (Join-Path $PSScriptRoot "edgebox-agent.exe"))) {
    $Agent = Join-Path $PSScriptRoot "edgebox-agent.exe"
}
if ($Agent -eq "" -and ($ConsoleUrl.StartsWith('@@') -or $CaSha256.StartsWith('@@'))) {
    Fail "this copy of the script names no console: fetch it from your console's /install.ps1, set EDGEBOX_CONSOLE_URL and EDGEBOX_CA_SHA256, or run it beside edgebox-agent.exe"
}
$principal = New-Object Security.Principal.WindowsPrincipal([Security.Principal.WindowsIdentity]::GetCurrent())
if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) {
    Fail "run it from an elevated PowerShell (Run as administrator)"
}
if (-not [Environment]::Is64BitOperatingSystem) {
    Fail "edgebox runs on 64-bit Windows"
}

# Trust only a server whose chain ends in the CA the token pins: the
# system's CA list does not know the console's private CA.
[Net.ServicePointManager]::SecurityProtocol = [Net.SecurityProtocolType]::Tls12 -bor 3072
$pinned = $CaSha256.ToLowerInvariant()
[Net.ServicePointManager]::ServerCertificateValidationCallback = {
    param($sender, $cert, $chain, $errors)
    $sha = [Security.Cryptography.SHA256]::Create()
    foreach ($el in $chain.ChainElements) {
        $h = -join ($sha.ComputeHash($el.Certificate.RawData) | ForEach-Object { $_.ToString("x2") })
        if ($h -eq $pinned) { return $true }
    }
    return $false
}

$client = New-Object Net.WebClient
if ($Proxy -ne "") { $client.Proxy = New-Object Net.WebProxy($Proxy) }
function Fetch([string]$path, [string]$file) {
    try {
        $client.DownloadFile("$ConsoleUrl/$path", $file)
    } catch {
        Fail "could not download $path from ${ConsoleUrl}: $($_.Exception.Message). If the certificate was refused, that server is not the console this token was made for: nothing was installed"
    }
}

function Install-Agent([string]$exe) {
    $agentArgs = @("install", $Token)
    if ($Name -ne "") { $agentArgs += @("--name", $Name) }
    if ($Labels -ne "") { $agentArgs += @("--labels", $Labels) }
    if ($Proxy -ne "") { $agentArgs += @("--proxy", $Proxy) }
    & $exe @agentArgs
    if ($LASTEXITCODE -ne 0) { Fail "edgebox-agent install failed (exit $LASTEXITCODE)" }
}

if ($Agent -ne "") {
    Write-Host "edgebox: installing $Agent"
    Install-Agent $Agent
    exit 0
}

$tmp = Join-Path ([IO.Path]::GetTempPath()) ("edgebox-" + [Guid]::NewGuid().ToString("N"))
New-Item -ItemType Directory -Path $tmp | Out-Null
try {
    $agentFile = "edgebox-agent-windows-amd64.exe"
    Write-Host "edgebox: downloading the agent ($agentFile) from $ConsoleUrl"
    Fetch "dl/SHA256SUMS" (Join-Path $tmp "SHA256SUMS")
    Fetch "dl/$agentFile" (Join-Path $tmp "edgebox-agent.exe")
    $want = ""
    foreach ($line in Get-Content (Join-Path $tmp "SHA256SUMS")) {
        $f = $line -split '\s+'
        if ($f.Length -ge 2 -and ($f[1] -eq $agentFile -or $f[1] -eq "*$agentFile")) { $want = $f[0].ToLowerInvariant() }
    }
    if ($want -eq "") { Fail "the console lists no checksum for ${agentFile}: nothing was installed" }
    $got = (Get-FileHash -Algorithm SHA256 (Join-Path $tmp "edgebox-agent.exe")).Hash.ToLowerInvariant()
    if ($got -ne $want) {
        Fail "the agent's SHA-256 is $got but the console lists ${want}: the download was changed on the way or on the console; nothing was installed"
    }
    Write-Host "edgebox: checksum verified ($got)"
    Install-Agent (Join-Path $tmp "edgebox-agent.exe")
} finally {
    Remove-Item -Recurse -Force $tmp -ErrorAction SilentlyContinue
}
