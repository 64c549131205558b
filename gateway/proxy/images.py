"""Images in proxied calls (issue 24): the ``image_url`` parts of a chat body's messages.

Every door translates to a chat body (the Messages door turns Anthropic ``image`` blocks, the
Responses door ``input_image`` parts into ``image_url`` parts), so a call's images are read
here, from the chat form, in order: ``message_index`` / ``part_index`` name the part in the
chat messages the step stores. ``data:`` URLs (base64) are decoded, checked and stored once
by content (pool.media); an ``http(s)`` URL is passed to the upstream as the agent
sent it and kept as a reference only: the gateway never fetches an address an agent chose.

``check_chat_images`` runs before the call goes upstream (gateway/proxy/runner.py), so a
call with a bad image is refused in the door's error shape and nothing is sent or stored;
``chat_images`` builds the step's images and the messages as stored, with each data URL
replaced by its image's download path (``/api/v1/media/<sha256>``), so the bytes are stored
once, never again inside each step's messages. What goes upstream is not changed.
"""

from __future__ import annotations

from typing import Any

from pool.errors import InvalidInput
from pool.ingest.media import ImageIn, check_count
from pool.media import media_check, media_decode_data_url
from pool.selectors.steps import media_path


def chat_images(messages: Any) -> tuple[list[ImageIn], Any]:
    """(the images of ``messages`` in order, the messages as stored). Messages without
    images come back as they are (the same object)."""
    if not isinstance(messages, list):
        return [], messages
    images: list[ImageIn] = []
    stored = None
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        new_parts = None
        for j, part in enumerate(content):
            url = _image_url(part)
            if url is None:
                continue
            at = f"messages[{i}].content[{j}].image_url.url"
            if url.startswith("data:"):
                data, declared = media_decode_data_url(url, field=at)
                im = ImageIn(field=at, data=data, declared_type=declared, message_index=i, part_index=j)
                if new_parts is None:
                    new_parts = list(content)
                new_parts[j] = {
                    **part,
                    "image_url": {**_as_dict(part["image_url"]), "url": media_path(im.sha256)},
                }
            elif url.lower().startswith(("http://", "https://")):
                im = ImageIn(field=at, url=url, message_index=i, part_index=j)
            else:
                raise InvalidInput("an image URL is a data: URL (base64) or an http(s) address", field=at)
            images.append(im)
        if new_parts is not None:
            if stored is None:
                stored = list(messages)
            stored[i] = {**m, "content": new_parts}
    check_count(len(images), "messages")
    return images, messages if stored is None else stored


def check_chat_images(chat: dict[str, Any]) -> None:
    """Refuse a call whose images would be refused at recording (bad bytes, wrong type, a
    decompression bomb, over the limits), before it goes upstream. No query; CPU only."""
    if not has_images(chat):
        return
    images, _ = chat_images(chat["messages"])
    for im in images:
        if im.data is not None:
            media_check(data=im.data, declared_type=im.declared_type, field=im.field)


def has_images(chat: Any) -> bool:
    """Whether a chat body's messages hold an ``image_url`` part (cheap: no decoding)."""
    messages = chat.get("messages") if isinstance(chat, dict) else None
    return isinstance(messages, list) and any(
        isinstance(m, dict)
        and isinstance(m.get("content"), list)
        and any(isinstance(p, dict) and p.get("type") == "image_url" for p in m["content"])
        for m in messages
    )


def _image_url(part: Any) -> str | None:
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return None
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    return url if isinstance(url, str) else None


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {"url": value}
