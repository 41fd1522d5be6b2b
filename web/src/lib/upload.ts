// Uploads a body with XMLHttpRequest, whose upload events report progress
// (fetch cannot). Same origin, so the session cookie goes along; the CSRF
// header proves the request comes from the app.
import type { Item } from './api';

export function uploadBody(
  id: string,
  file: File,
  onProgress: (fraction: number) => void,
): Promise<Item> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('PUT', `/api/v1/items/${encodeURIComponent(id)}/body`);
    xhr.setRequestHeader('Content-Type', file.type || 'application/octet-stream');
    xhr.setRequestHeader('X-Tarn-CSRF', '1');
    xhr.responseType = 'json';
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) onProgress(e.loaded / e.total);
    };
    xhr.onload = () => {
      if (xhr.status === 200) {
        onProgress(1);
        resolve(xhr.response as Item);
      } else {
        reject(new Error(xhr.response?.detail ?? `upload failed (${xhr.status})`));
      }
    };
    xhr.onerror = () => reject(new Error('the upload broke off'));
    xhr.send(file);
  });
}
