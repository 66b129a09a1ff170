# Installs the edgebox agent on a Windows box: downloads it from the
# console, checks it, and hands over to 'edgebox-agent.exe install', which
# does the rest (administrator check, enrollment, the Windows service and
# its recovery, waiting until the box is online) and is tested in Go.
#
# The console serves this script at /install.ps1 with its URL, the SHA-256
# of its CA and the SHA-256 of its Windows agent filled in; the line
# 'edgebox token create' prints fetches it over a connection whose chain
# must end in that CA, and this script fetches the agent the same way.
#
# Beside edgebox-agent.exe (the release's Windows zip), it hands over to
# that binary without downloading anything.
#
#   .\install.ps1 -Token TOKEN [-Name NAME] [-Labels k=v,...] [-Proxy URL]
param(
    [Parameter(Mandatory = $true)][string]$Token,
    [string]$Name = "",
    [string]$Labels = "",
    [string]$Proxy = ""
)
$ErrorActionPreference = "Stop"

$ConsoleUrl = '@@CONSOLE_URL@@'
$CaSha256 = '@@CA_SHA256@@'
$AgentFile = 'edgebox-agent-windows-amd64.exe'
$AgentSha256 = '@@AGENT_SHA256@@'

function Fail([string]$msg) {
    Write-Host "edgebox install: $msg" -ForegroundColor Red
    exit 1
}

# The options go to 'edgebox-agent install' as they are.
$agentArgs = @("install", $Token)
if ($Name -ne "") { $agentArgs += @("--name", $Name) }
if ($Labels -ne "") { $agentArgs += @("--labels", $Labels) }
if ($Proxy -ne "") { $agentArgs += @("--proxy", $Proxy) }

if ($PSScriptRoot -and (Test-Path (Join-Path $PSScriptRoot "edgebox-agent.exe"))) {
    & (Join-Path $PSScriptRoot "edgebox-agent.exe") @agentArgs
    exit $LASTEXITCODE
}
if ($ConsoleUrl.StartsWith('@@') -or $CaSha256.StartsWith('@@') -or $AgentSha256.StartsWith('@@')) {
    Fail "this copy of the script names no console: fetch it from your console's /install.ps1, or run it beside edgebox-agent.exe"
}
if ($AgentSha256 -eq "") {
    Fail "the console at $ConsoleUrl serves no Windows agent ($AgentFile): ask its operator to put 'make dist' output in its --dist directory"
}
if (-not [Environment]::Is64BitOperatingSystem) {
    Fail "edgebox runs on 64-bit Windows"
}

# Trust only a server whose chain ends in the pinned CA: the system's CA
# list does not know the console's private CA.
[Net.ServicePointManager]::SecurityProtocol = [Net.SecurityProtocolType]::Tls12
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
$exe = Join-Path ([IO.Path]::GetTempPath()) ("edgebox-agent-" + [Guid]::NewGuid().ToString("N") + ".exe")
Write-Host "edgebox: downloading the agent from $ConsoleUrl/dl/$AgentFile"
try {
    $client.DownloadFile("$ConsoleUrl/dl/$AgentFile", $exe)
} catch {
    Fail "could not download the agent from ${ConsoleUrl}: $($_.Exception.Message). If the certificate was refused, that server is not the console this token was made for: nothing was installed"
}
$got = (Get-FileHash -Algorithm SHA256 $exe).Hash.ToLowerInvariant()
if ($got -ne $AgentSha256.ToLowerInvariant()) {
    Remove-Item -Force $exe -ErrorAction SilentlyContinue
    Fail "the agent's SHA-256 is $got, not $AgentSha256 as the console said: the download was changed on the way; nothing was installed"
}
Write-Host "edgebox: checksum verified ($got)"
try {
    & $exe @agentArgs
    $code = $LASTEXITCODE
} finally {
    # The installer has copied itself to its place by now.
    Remove-Item -Force $exe -ErrorAction SilentlyContinue
}
exit $code
