"""Chromium and Datastar 1.0 read the stream's `retry:` field: a restart's reconnect waits it.

Datastar v1.0.1's fetch sets its retry interval from SSE's `retry:` field; when the stream
ends it waits that interval and reconnects, and when a reconnect is refused it says so in the
console ("retrying in N ms") with that same interval. The page's own copy of its stream's body
(a tee of the response Datastar reads, decoded by the browser from zstd) gives the value on the
wire to compare with.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.support import REPO
from tests.support.browser import Server, wait_for_datastar

# Every stream body the page reads, teed: the `retry:` values its first events carry.
RECORD_RETRIES = """
window.lithRetries = [];
const fetchOfPage = window.fetch;
window.fetch = async (...args) => {
  const answer = await fetchOfPage(...args);
  const url = String(args[0] instanceof Request ? args[0].url : args[0]);
  if (!url.includes('/lith/stream') || !answer.body) return answer;
  const [forDatastar, forTest] = answer.body.tee();
  (async () => {
    const reader = forTest.getReader(), decoder = new TextDecoder();
    let text = '';
    for (;;) {
      const {done, value} = await reader.read();
      if (done) return;
      text += decoder.decode(value, {stream: true});
      const found = /^retry: *(\\d+)$/m.exec(text);
      if (found) { window.lithRetries.push(Number(found[1])); reader.cancel(); return; }
    }
  })();
  return new Response(forDatastar, {status: answer.status, statusText: answer.statusText, headers: answer.headers});
};
"""


def test_a_restarted_server_is_reconnected_to_after_the_retry_its_stream_sent(
    new_page: Callable[..., Page], server_factory: Callable[..., Server], tmp_path: Path
) -> None:
    server = server_factory("bench.lib.tabsapp:app", cwd=REPO,
                            env={"COUNTER_DB": str(tmp_path / "counter.db"), "TABS_RECONNECT_WITHIN": "4"})
    page = new_page()
    page.add_init_script(RECORD_RETRIES)
    page.goto(f"{server.url}/")
    wait_for_datastar(page)
    page.wait_for_function("window.lithRetries.length === 1")
    sent = page.evaluate("window.lithRetries[0]")
    assert 1000 <= sent <= 4000

    # The stream ends at the SIGTERM; the reconnect `sent` ms later is refused, and Datastar
    # names the interval it waits before the next.
    with page.expect_console_message(lambda m: "retrying in" in m.text, timeout=20_000) as refused:
        server.stop()
    waited = int(re.search(r"retrying in (\d+)ms", refused.value.text).group(1))  # type: ignore[union-attr]
    assert waited == sent, f"Datastar waits {waited} ms, the stream said {sent}"

    server.start()
    page.wait_for_function("window.lithRetries.length === 2", timeout=40_000)
    page.get_by_role("button", name="Add").click()
    expect(page.locator("#counter")).to_have_text("1")
