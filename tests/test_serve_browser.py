"""The page of `vitkit serve` in a real browser: Debian's Chromium driven by Selenium (chromedriver) uploads a
photo and reads the top-1 label from the page (`make test` installs chromium and chromium-driver as root).

VITKIT_SERVE_SCREENSHOT=PATH saves the page as PNG (docs/figures/serve/page.png is made this way)."""
import os
import shutil
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")

from _serve import LABELS, serving, tiny_checkpoint  # noqa: E402
from vitkit.serve.app import create_app  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("Chromium or chromedriver is not installed (apt-get install chromium chromium-driver; "
                    "`make test` does it as root)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1000,900", "--force-device-scale-factor=1", "--no-first-run"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)  # no selenium-manager download
    yield driver
    driver.quit()


def _photo(path):
    try:
        from skimage import data
        img = data.chelsea()
    except ImportError:
        import numpy as np
        img = (np.random.default_rng(0).random((300, 450, 3)) * 255).astype("uint8")
    from PIL import Image
    Image.fromarray(img).save(path)
    return path


def test_page_uploads_and_shows_top1(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    shot = os.environ.get("VITKIT_SERVE_SCREENSHOT")
    size = 224 if shot else 32  # the screenshot at a resolution that shows the rollout
    ckpt = tiny_checkpoint(tmp_path / "tiny", img_size=size)
    photo = _photo(tmp_path / "chelsea.png")
    with serving(create_app(str(ckpt), engine="torch", engine_budget_s=0, model_id="tiny-vit (random weights)")) as srv:
        want = httpx.post(srv.url + "/v1/classify", files={"file": ("chelsea.png", photo.read_bytes(), "image/png")})
        top1 = want.json()["results"][0]["top"][0]["label"]
        assert top1 in LABELS

        browser.get(srv.url + "/")
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: "engine torch" in d.find_element(By.ID, "model").text)
        # keyboard: Tab reaches the drop zone, which names what Enter / Space do
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
        assert browser.switch_to.active_element.get_attribute("id") == "drop"
        browser.find_element(By.ID, "files").send_keys(str(photo))
        label = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, "#results .top li .label")))
        assert label.text == top1
        bars = browser.find_elements(By.CSS_SELECTOR, "#results .card:first-child .top li")
        assert len(bars) == len(LABELS)  # top-5 of 5 classes
        overlay = browser.find_element(By.CSS_SELECTOR, "#results .overlay")
        loaded = "return arguments[0].complete && arguments[0].naturalWidth"
        wait.until(lambda d: d.execute_script(loaded, overlay) == size)
        timing = browser.find_element(By.CSS_SELECTOR, "#results .timing").text
        assert "engine torch" in timing and "ms" in timing
        assert "1 of 1 classified" in browser.find_element(By.ID, "status").text
        # every asset came from the server itself
        urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert urls and all(u.startswith(srv.url) or u.startswith("data:") or u.startswith("blob:") for u in urls)
        if shot:
            time.sleep(0.3)
            browser.save_screenshot(shot)
