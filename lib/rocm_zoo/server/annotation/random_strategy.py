"""`/activelearning/random`: MONAI Label's random next sample, without its 500 when viewers ask within one second.

MONAI Label weighs each unlabelled image by the seconds since it was last offered (the strategy stamps the image with
the second it offers it), so that a just-offered image is unlikely to be offered again. When every unlabelled image
was offered within the current second, every weight is 0 and `random.choices` raises ("Total of weights must be
greater than zero"): two viewers asking at once, or one asking twice, got a 500 with one image left. Here an image
weighs at least 1: the same preference, and an answer always.
"""

from __future__ import annotations

import logging
import random
import time

from monailabel.interfaces.datastore import Datastore
from monailabel.tasks.activelearning.random import Random

logger = logging.getLogger(__name__)


class RandomStrategy(Random):
    def __call__(self, request, datastore: Datastore):
        images = datastore.get_unlabeled_images(request.get("label_tag"), request.get("labels"))
        if not len(images):
            return None
        strategy = request["strategy"]
        now = int(time.time())
        weights = [max(1, now - datastore.get_image_info(image).get("strategy", {}).get(strategy, {}).get("ts", 0))
                   for image in images]
        image = random.choices(images, weights=weights)[0]
        logger.info("Random: Selected Image: %s; Weight: %s", image, weights[images.index(image)])
        return {"id": image, "weight": weights[images.index(image)]}
