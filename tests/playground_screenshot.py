"""The playground's screenshot in the docs (docs/playground.png), made again from scratch:

    PYTHONPATH=. .venv/bin/python -m tests.playground_screenshot docs/playground.png

It serves the demo model (seed 0, as `make serve`), drives headless Chromium through two phrasings of a choice with
evidence and facts, opens the compare view and copies the request as curl. Timings differ from run to run.
Pillow comes with matplotlib (the dev extra).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PIL import Image

from basal.core.model.model_dir import ModelDir
from basal.core.model.synth import synth_model
from tests.browser import Browser
from tests.servers import live_server, make_engines

STATE = (
    "Dziś jest 15 kwietnia 2026 r. Klient odebrał paczkę 21 marca 2026 r. i pisze: wypłaty nie działają od 3 dni, "
    "proszę o pilny kontakt."
)
OPTIONS = "billing: Płatności, faktury, zwroty\ntechnical: Błędy, awarie\nlogistics: Dostawy"


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = ModelDir.load(synth_model(Path(tmp) / "demo", "demo", seed=0, evidence_head=True))
        with live_server(make_engines(model)) as url:
            browser = Browser(Path(tmp) / "profile", width=1400, height=900)
            try:
                browser.goto(f"{url}/")
                browser.wait_for("document.querySelectorAll('#model option').length > 0")
                browser.fill("#dialect", "basal")
                browser.fill("#state", STATE)
                browser.evaluate("document.querySelector('#facts').checked = true")
                browser.evaluate(
                    "document.querySelector('#questions .question:nth-child(1) .q-evidence').checked = true"
                )
                browser.fill("#questions .question:nth-child(1) .q-instructions", "Czy sprawa jest pilna?")
                browser.fill("#questions .question:nth-child(2) .q-options", OPTIONS)
                for n, phrasing in enumerate(
                    ["Który zespół powinien się tym zająć?", "Do którego działu trafia zgłoszenie?"]
                ):
                    browser.fill("#questions .question:nth-child(2) .q-instructions", phrasing)
                    browser.click("#send")
                    browser.wait_for(f"document.querySelectorAll('#runs li').length > {n}")
                browser.click("#compare")
                browser.click("button[data-copy=curl]")
                browser.screenshot(out)
            finally:
                browser.close()
    # 128 colours without dithering: the page's flat colours and text stay sharp, the file a third of the size
    image = Image.open(out).convert("RGB")
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, optimize=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
