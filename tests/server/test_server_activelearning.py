"""`/activelearning/{strategy}` as Slicer and OHIF ask it (POST, JSON params with client_id): MONAI Label's random and
first, and uncertainty, which ranks the unlabelled studies by the phantom-trained DeepEdit's doubt over flips.

A datastore of its own (labels are saved into it): two clean phantoms, one with a spleen at the HU of the tissue
around it (the model cannot tell where it ends), and one of static (uniform noise, no anatomy). Measured with the tiny
weights and the default 2 flips: static 0.80, faint spleen 0.73, clean phantoms 0.54-0.64 (rocm_zoo.engine.
flip_uncertainty gives the score).
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time

import numpy as np
import pytest
import requests

from rocm_zoo.samples import phantom
from zoo_test_support import monailabel_server

pytestmark = pytest.mark.slow

CLEAN = ("phantom_test0", "phantom_test1")
STATIC, FAINT = "static_noise", "faint_spleen"
SPLEEN = 1  # the phantoms' truth label of the spleen


@pytest.fixture(scope="module")
def activelearning(sample_env, tmp_path_factory):
    root = tmp_path_factory.mktemp("activelearning")
    studies = root / "studies"
    studies.mkdir()
    for image_id in CLEAN:
        shutil.copy(sample_env.image_path(image_id), studies)
    base = phantom.make_phantom(sample_env.specs[0])  # phantom_test0's grid, so its truth fits as a label of each
    static = np.random.default_rng(17).uniform(-1000, 1000, base.image.shape).astype(np.int16)
    faint = np.where(base.truth == SPLEEN, 40, base.image).astype(np.int16)
    for name, image in ((STATIC, static), (FAINT, faint)):
        phantom.write_phantom(dataclasses.replace(base, image=image), studies / f"{name}.nii.gz",
                              root / f"{name}_truth.nii.gz")
    with monailabel_server(sample_env.app_dir, str(studies), "spleen_deepedit", root / "server.log", cwd=root,
                           timeout_s=900, env={"TORCHINDUCTOR_CACHE_DIR": str(sample_env.root / "inductor")},
                           conf={"uncertainty_model": "spleen_deepedit_seg"}) as url:
        yield url


def next_sample(url: str, strategy: str) -> requests.Response:
    """MONAILabelClient.next_sample: POST with the params as a JSON body."""
    return requests.post(f"{url}/activelearning/{strategy}", json={"client_id": "annotator-1"}, timeout=300)


def save_final(url: str, image_id: str, sample_env) -> None:
    """The image's truth (phantom_test0's for the two made on its grid) saved as an annotator's label."""
    truth = sample_env.paths.truth / f"{image_id if image_id in CLEAN else CLEAN[0]}.nii.gz"
    with open(truth, "rb") as f:
        r = requests.put(f"{url}/datastore/label", params={"image": image_id, "tag": "final"},
                         files={"label": (f"{image_id}.nii.gz", f)}, timeout=60)
    assert r.status_code == 200, r.text


def test_next_sample_random_first_and_most_uncertain(activelearning, sample_env):
    url = activelearning
    strategies = requests.get(f"{url}/info/", timeout=30).json()["strategies"]
    assert set(strategies) == {"random", "first", "uncertainty"}
    assert "spleen_deepedit_seg" in strategies["uncertainty"]["description"]

    save_final(url, CLEAN[0], sample_env)
    unlabelled = {CLEAN[1], STATIC, FAINT}
    r = next_sample(url, "random")
    assert r.status_code == 200 and r.json()["id"] in unlabelled, r.text
    # Four viewers asking three times each, at once: within a second every unlabelled study has been offered, which
    # gave MONAI Label's random strategy only zero weights (a 500). Each answers a study still to annotate.
    answers: list[requests.Response] = []

    def viewer() -> None:
        for _ in range(3):
            answers.append(next_sample(url, "random"))

    viewers = [threading.Thread(target=viewer) for _ in range(4)]
    for t in viewers:
        t.start()
    for t in viewers:
        t.join(120)
    assert len(answers) == 12 and all(a.status_code == 200 and a.json()["id"] in unlabelled for a in answers), \
        [(a.status_code, a.text[:200]) for a in answers]
    r = next_sample(url, "first")
    assert r.status_code == 200 and r.json()["id"] == min(unlabelled), r.text
    r = next_sample(url, "no_such_strategy")
    assert r.status_code == 404 and "no_such_strategy" in r.json()["detail"], r.text

    # The ranking runs the network over every unlabelled study; meanwhile the server answers (not on its event loop).
    ranking = {}
    thread = threading.Thread(target=lambda: ranking.update(r=next_sample(url, "uncertainty")), daemon=True)
    thread.start()
    answered_meanwhile = []
    while thread.is_alive():
        start = time.perf_counter()
        assert requests.get(f"{url}/health/live", timeout=10).status_code == 200
        answered_meanwhile.append(time.perf_counter() - start)
        time.sleep(0.2)
    thread.join()
    assert len(answered_meanwhile) >= 3 and max(answered_meanwhile) < 2.0, answered_meanwhile
    r = ranking["r"]
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["id"] == STATIC, answer
    assert (answer["scored"], answer["unscored"], answer["failed"]) == (3, 0, 0), answer
    assert answer["model"] == "spleen_deepedit_seg" and 0 < answer["score"] <= 1

    # Annotated: the next most uncertain (from the scores already computed), never a labelled study.
    save_final(url, STATIC, sample_env)
    answer = next_sample(url, "uncertainty").json()
    assert answer["id"] == FAINT and answer["scored"] == 2, answer

    for image_id in unlabelled - {STATIC}:
        save_final(url, image_id, sample_env)
    r = next_sample(url, "uncertainty")
    assert r.status_code == 200 and r.json() == {}, r.text  # MONAI Label's answer when nothing is left to annotate
