"""`nbgrader collect` that takes nothing a student planted in the exchange's inbound folder.

Students can write into inbound (it has to be: `nbgrader submit` copies there as the student), so a student can
put there a link named like a submission — to the course's `source/` with the reference answers, to another
student's folder — or a folder named for another student. Stock nbgrader follows links when it copies and only
logs a warning when a folder's owner is not the student it names. This collect refuses both: a submission is
taken only when it is a real folder owned by the student it names, holding only regular files and folders; the
copy never follows a link. A refused submission is named in the log as an error, and that student's newest
acceptable submission is collected instead, if there is one.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import stat
from pathlib import Path

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.utils import ignore_patterns


def refusal(path: Path, student: str, check_owner: bool) -> str:
    """Why the inbound entry `path` may not be collected as `student`'s submission, or ''."""
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "it is a link"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a folder"
    if check_owner:
        try:
            owner = pwd.getpwuid(info.st_uid).pw_name
        except KeyError:
            owner = f"uid {info.st_uid}"
        if owner != student:
            return f"it belongs to {owner}, not to {student}"
    return odd_entry(path)


def odd_entry(folder: Path) -> str:
    """What in `folder` is neither a regular file nor a folder (a link, a device, a fifo), or ''."""
    for current, folders, files in os.walk(folder):
        for name in folders + files:
            mode = os.lstat(os.path.join(current, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return f"{os.path.relpath(os.path.join(current, name), folder)} is a link or a special file"
    return ""


class SafeCollect(ExchangeCollect):
    """nbgrader's collect, refusing links, special files and submissions another user made (module docstring)."""

    src_records: list[dict]  # nbgrader's: the submission chosen per student (username, filename, timestamp)

    def init_src(self) -> None:
        super().init_src()
        kept: list[dict] = []
        for record in self.src_records:
            pattern = f"{glob.escape(record['username'])}+{glob.escape(self.coursedir.assignment_id)}+*"
            newest_first = self._sort_by_timestamp(
                [self._path_to_record(str(p)) for p in Path(self.inbound_path).glob(pattern)])
            for candidate in [record, *(r for r in newest_first if r["filename"] != record["filename"])]:
                why = refusal(Path(self.inbound_path) / candidate["filename"], candidate["username"], self.check_owner)
                if not why:
                    kept.append(candidate)
                    break
                self.log.error("not collected: %s (%s)", candidate["filename"], why)
        self.src_records = kept

    def do_copy(self, src: str, dest: str, log: object = None) -> None:
        """Copy `src` without following any link: the folder is opened without following a link, its copy keeps
        links as links, and a copy holding one is removed again (a link swapped in after init_src's check)."""
        try:
            fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as err:
            self.log.error("not collected: %s (%s)", src, err.strerror)
            return
        try:
            if self.get_size(f"/proc/self/fd/{fd}") > 1000 * self.coursedir.max_dir_size:  # nbgrader's own limit
                self.log.error("not collected: %s (larger than %d kB)", src, self.coursedir.max_dir_size)
                return
            shutil.copytree(f"/proc/self/fd/{fd}", dest, symlinks=True,
                            ignore=ignore_patterns(exclude=self.coursedir.ignore, include=self.coursedir.include,
                                                   max_file_size=self.coursedir.max_file_size, log=self.log))
        finally:
            os.close(fd)
        why = odd_entry(Path(dest))
        if why:
            shutil.rmtree(dest)
            self.log.error("not collected: %s (%s)", src, why)
