// What every browser test script starts with: Chromium as the tests run
// it, and pages whose navigations ride out the host's network changing.
import { chromium } from 'playwright-core';

/** launch starts the Chromium at EDGEBOX_CHROMIUM (default /usr/bin/chromium), headless. */
export function launch() {
  return chromium.launch({
    executablePath: process.env.EDGEBOX_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
}

/**
 * steady makes page.goto try again, up to five times, when Chromium
 * aborted the navigation because the host's network changed
 * (net::ERR_NETWORK_CHANGED): other tests on the same machine add and
 * remove bridges, taps and namespaces, and Chromium drops what is in
 * flight whenever an address comes or goes, even for a page on loopback.
 */
export function steady(page) {
  const goto = page.goto.bind(page);
  page.goto = async (url, opts) => {
    for (let i = 1; ; i++) {
      try {
        return await goto(url, opts);
      } catch (e) {
        if (i >= 5 || !/ERR_NETWORK_CHANGED/.test(e.message)) throw e;
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  };
  return page;
}
